"""The one bound every wait in the suite uses.

A test waits for an event (a row, a process state, an element on the page), never for
a stretch of wall time; this bound only says when to give up and fail.  It is far above
any expected wait: under load a 2-core machine's scheduler can give a test's processes a
small fraction of a core (the suite shares its cores with its own other workers, and a
busy loop started in a session of its own gets as large a share as the whole suite), so a
page that draws in 3 s idle drew in 40-60 s here with other work running."""
EVENT_S = 600
EVENT_MS = EVENT_S * 1000
