"""The process grid and the kinds of parallelism the runtime applies over it
(torchtitan's shape: `grid` holds the mesh and its groups, one module per kind
of parallelism; the runtime calls them)."""
