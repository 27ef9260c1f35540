#!/bin/sh
# A sandbox prefix for run-battery.sh that starts `shoal up` (a coordinator
# with its Kaimon bus, MCP endpoint and a local node running claude) in the
# battery's environment, tells the battery its doors (NATS_PORT, BUS_PATH,
# MCP_PORT in $BATTERY_DIR/env), and then either
#
#   shoal-up.sh beside CMD...        runs CMD beside it, as it is
#   shoal-up.sh inside KIND CMD...   has a sandboxed claude agent (sandbox
#                                    kind KIND) run CMD with its Bash tool
#
# Inside, the prompt is the command itself; the model server the test runs
# answers a prompt with a Bash call of it and then with "done". The
# command's output is written in $BATTERY_DIR and printed here afterwards.
# The agent may reach each of NAMES (space-separated host names) on the
# port of hostd's listener, through its proxy. Needs SHOAL (the shoal
# binary), CLAUDE (the claude CLI) and the claude CLI's model environment.
set -eu
mode=$1; shift
kind=
if [ "$mode" = inside ]; then kind=$1; shift; fi
B=${BATTERY_DIR:?}
state=$(mktemp -d)
"$SHOAL" up --port -1 --mcp-listen 127.0.0.1:0 --claude "$CLAUDE" --node-name n --sandbox-kind "${kind:-namespaces}" >"$state/up.out" 2>"$state/up.err" &
up=$!
stop() {
  kill "$up" 2>/dev/null || true
  wait "$up" 2>/dev/null || true
  rm -rf "$state"
}
trap stop EXIT
i=0
until grep -q '^shoal: ready' "$state/up.out"; do
  i=$((i + 1))
  if [ $i -gt 600 ] || ! kill -0 "$up" 2>/dev/null; then
    echo "shoal up did not get ready:" >&2
    cat "$state/up.out" "$state/up.err" >&2
    exit 1
  fi
  sleep 0.1
done
nats=$(sed -n 's/^shoal: NATS listening on //p' "$state/up.out")
bus=$(sed -n 's|^shoal: Kaimon bus ipc://||p' "$state/up.out")
mcp=$(sed -n 's/^shoal: MCP endpoint //p' "$state/up.out")
mcp=${mcp%/mcp}
{
  echo "NATS_PORT='${nats##*:}'"
  echo "BUS_PATH='$bus'"
  echo "MCP_PORT='${mcp##*:}'"
} >>"$B/env"
export SHOAL_NATS="$nats"
if [ "$mode" = beside ]; then
  "$@"
  exit $?
fi
net=$(. "$B/env" && for n in ${NAMES:-}; do printf '%s:%s,' "$n" "$TCPPORT"; done)
id=$("$SHOAL" open --permission bypass --sandbox --sandbox-kind "$kind" --sandbox-net "${net%,}" "$PWD")
"$SHOAL" run "$id" "$* >$B/out.raw 2>$B/out.err" >"$state/run.out"
"$SHOAL" close "$id" >/dev/null
cat "$B/out.raw"
cat "$B/out.err" >&2
