#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the storage tests.
#
#   source scripts/start_postgres.sh   # exports MPIPE_TEST_PG_URL; the server stops
#                                      # when the sourcing shell (or what it execs) exits
#   bash scripts/start_postgres.sh     # prints the URL and the command that stops it
#
# On a fresh Debian machine it installs Debian's `postgresql` package first.  The
# cluster lives in a temporary folder, listens on a free loopback port only, trusts
# loopback connections (it holds nothing but test data) and is owned by a non-root
# user, because postgres refuses to run as root.  Any failure is loud: the
# message goes to stderr and the script returns non-zero.

_mpipe_pg_fail() {
    echo "start_postgres.sh: $*" >&2
    return 1
}

_mpipe_pg_bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
        echo "$dir"
    fi
}

_mpipe_pg_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

_mpipe_pg_start() {
    local bindir owner datadir port log run_as
    bindir=$(_mpipe_pg_bindir)
    if [ -z "$bindir" ]; then
        echo "start_postgres.sh: PostgreSQL not found; installing Debian's postgresql package" >&2
        if [ "$(id -u)" -ne 0 ]; then
            _mpipe_pg_fail "PostgreSQL is not installed and this user cannot apt-get install it" || return 1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 \
            || { _mpipe_pg_fail "apt-get install postgresql failed"; return 1; }
        bindir=$(_mpipe_pg_bindir)
        [ -n "$bindir" ] || { _mpipe_pg_fail "postgresql installed but no initdb under /usr/lib/postgresql"; return 1; }
    fi

    run_as=()
    owner=$(id -un)
    if [ "$(id -u)" -eq 0 ]; then
        owner=postgres
        if ! id "$owner" >/dev/null 2>&1; then
            useradd --system --no-create-home --shell /usr/sbin/nologin "$owner" \
                || { _mpipe_pg_fail "cannot create user $owner to run postgres"; return 1; }
        fi
        run_as=(runuser -u "$owner" --)
    fi

    datadir=$(mktemp -d "${TMPDIR:-/tmp}/mpipe-pg.XXXXXX") || { _mpipe_pg_fail "mktemp failed"; return 1; }
    chmod 700 "$datadir"
    [ "$owner" = "$(id -un)" ] || chown "$owner" "$datadir"
    log="$datadir/server.log"

    "${run_as[@]}" "$bindir/initdb" -D "$datadir/data" -U postgres --auth=trust \
        --encoding=UTF8 --no-sync >"$datadir/initdb.log" 2>&1 \
        || { cat "$datadir/initdb.log" >&2; _mpipe_pg_fail "initdb failed (log above)"; return 1; }

    port=$(_mpipe_pg_free_port) || { _mpipe_pg_fail "no free port"; return 1; }
    # fsync off: a test cluster that dies with the machine loses nothing of value.
    "${run_as[@]}" "$bindir/pg_ctl" -D "$datadir/data" -l "$log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$datadir -c fsync=off -c max_connections=200" \
        start >/dev/null \
        || { cat "$log" >&2; _mpipe_pg_fail "the server did not start (log above)"; return 1; }

    "$bindir/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
        -c "CREATE DATABASE mpipe_test" >/dev/null \
        || { "${run_as[@]}" "$bindir/pg_ctl" -D "$datadir/data" -m immediate stop >/dev/null 2>&1
             _mpipe_pg_fail "CREATE DATABASE failed"; return 1; }

    MPIPE_PG_DATADIR="$datadir"
    MPIPE_PG_STOP="${run_as[*]} $bindir/pg_ctl -D $datadir/data -m fast stop"
    MPIPE_TEST_PG_URL="postgresql+psycopg://postgres@127.0.0.1:$port/mpipe_test"
    export MPIPE_TEST_PG_URL MPIPE_PG_DATADIR
}

_mpipe_pg_stop() {
    if [ -n "${MPIPE_PG_STOP:-}" ]; then
        $MPIPE_PG_STOP >/dev/null 2>&1 || true
        rm -rf "$MPIPE_PG_DATADIR"
        MPIPE_PG_STOP=
    fi
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    # Sourced: stop the server when this shell exits, and also when the process
    # that keeps its pid (`exec pytest ...`) exits, since exec drops EXIT traps.
    _mpipe_pg_start || return 1
    trap _mpipe_pg_stop EXIT
    (
        trap '' HUP INT
        parent=$$
        while kill -0 "$parent" 2>/dev/null; do sleep 1; done
        _mpipe_pg_stop
    ) </dev/null >/dev/null 2>&1 &
    echo "PostgreSQL for the tests: $MPIPE_TEST_PG_URL" >&2
else
    set -euo pipefail
    _mpipe_pg_start
    echo "export MPIPE_TEST_PG_URL=$MPIPE_TEST_PG_URL"
    echo "# stop it with: $MPIPE_PG_STOP && rm -rf $MPIPE_PG_DATADIR"
fi
