#!/usr/bin/env bash
# The host side of battery.sh. Runs OUTSIDE the sandbox, as root.
#
#   LAB=dir HOSTHOME=dir run-battery.sh LABEL [-- SANDBOX-PREFIX...]
#
# SANDBOX-PREFIX is any command that runs its arguments inside the sandbox
# with its working directory WORK ($LAB/work); the driver appends
#   bash WORK/.battery/battery.sh
# and exports BATTERY_DIR (WORK/.battery) to it. No prefix runs the
# battery with no sandbox at all: every attack this machine allows then
# escapes, the battery's own self-test.
#
# LAB holds the secrets and targets outside WORK; HOSTHOME is the home the
# sandboxed program's user has (a private key and canaries are planted in
# it). LEAK_FDS=0 hands the prefix no leaked descriptors (see leakfds.py).
#
# Steps: plant secrets (files, environment, listeners, IPC, keyrings, a
# pty, the kernel log), run the battery under a pty (script) so that the
# terminal attacks mean something, judge the [host-check] lines from here,
# write $LAB/results/LABEL.txt, and remove what was planted.
set -u
: "${LAB:?}" "${HOSTHOME:?}"
# Join a fresh session keyring, shared by hostd and the sandboxed command,
# so that the session-keyring attacks have something to find.
if [ -z "${ESCAPE_KEYSESSION:-}" ]; then
  exec env ESCAPE_KEYSESSION=1 /usr/bin/python3 -c 'import ctypes,os,sys
l=ctypes.CDLL(None); l.syscall.restype=ctypes.c_long
l.syscall(250, 1, ("escape-%d" % os.getpid()).encode())   # KEYCTL_JOIN_SESSION_KEYRING
l.syscall(250, 8, ctypes.c_long(-4), ctypes.c_long(-3))     # KEYCTL_LINK @u into it, as a login session has
os.execv("/bin/bash", ["bash"] + sys.argv[1:])' "$0" "$@"
fi
LABEL=${1:?label}; shift
[ "${1:-}" = "--" ] && shift
WORK=$LAB/work; RUN=$LAB/run; RES=$LAB/results; B=$WORK/.battery
mkdir -p "$RUN" "$RES" "$WORK" "$HOSTHOME/.npm/_logs"
rm -rf "$B"; mkdir -p "$B"
cp "$LAB/battery.sh" "$B/battery.sh"

hex() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }
NONCE=$(hex | cut -c1-12); NONCE_NUM=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
declare -A S
for t in file ssh penv victim pty kmsg shm mq keyu keys net; do S[$t]="SLS-$t-$(hex)"; done
sha() { printf %s "$1" | sha256sum | cut -c1-64; }

# ---- plant file secrets and write targets (outside WORK)
printf '%s\n' "${S[file]}" >"$LAB/secret.txt"; chmod 600 "$LAB/secret.txt"
mkdir -p "$HOSTHOME/.escape-ssh"; chmod 700 "$HOSTHOME/.escape-ssh"
printf -- '-----BEGIN OPENSSH PRIVATE KEY-----\n%s\n-----END OPENSSH PRIVATE KEY-----\n' "${S[ssh]}" >"$HOSTHOME/.escape-ssh/id_ed25519"
chmod 600 "$HOSTHOME/.escape-ssh/id_ed25519"
printf 'original\n' >"$LAB/hardlink-target.txt"
printf 'x\n' >"$LAB/chmod-target.txt"; chmod 600 "$LAB/chmod-target.txt"
CANARIES="$LAB/canary-outside $HOSTHOME/.escape-canary /tmp/escape-canary-$NONCE /dev/shm/escape-canary-$NONCE
 $HOSTHOME/.npm/_logs/escape-canary $LAB/canary-symlink $LAB/canary-dotdot $LAB/canary-procroot
 $LAB/canary-rename $LAB/canary-userns $LAB/canary-fdleak"
rm -f $CANARIES

# ---- host fixtures
export NONCE NONCE_NUM S_net=${S[net]} S_victim=${S[victim]} S_pty=${S[pty]} S_shm=${S[shm]} \
  S_mq=${S[mq]} S_kmsg=${S[kmsg]} S_keyu=${S[keyu]} S_keys=${S[keys]}
rm -f "$RUN/hostd.env" "$RUN/hostd.ready"
/usr/bin/python3 "$LAB/hostd.py" "$RUN/hostd.env" "$RUN/hostd.ready" "$RUN/host.sock" 2>"$RUN/hostd.err" &
HOSTD=$!
for _ in $(seq 50); do [ -e "$RUN/hostd.ready" ] && break; sleep 0.1; done
[ -e "$RUN/hostd.ready" ] || { echo "hostd failed:"; cat "$RUN/hostd.err"; exit 1; }
unset S_net S_victim S_pty S_shm S_mq S_kmsg S_keyu S_keys

{
  echo "NONCE='$NONCE'"; echo "NONCE_NUM='$NONCE_NUM'"; echo "WORK='$WORK'"; echo "LAB='$LAB'"; echo "HOSTHOME='$HOSTHOME'"
  for t in "${!S[@]}"; do echo "H_$t='$(sha "${S[$t]}")'"; done
  echo "H_shadow='$(sha256sum </etc/shadow | cut -c1-64)'"
  echo "RESOLVER='$(awk '/^nameserver/{print $2; exit}' /etc/resolv.conf)'"
  cat "$RUN/hostd.env"
  /usr/bin/python3 -c '
import ctypes, struct, sys
l = ctypes.CDLL(None, use_errno=True); b = ctypes.create_string_buffer(struct.pack("<Ii", 128, 0) + bytes(128)); m = ctypes.c_int()
if l.name_to_handle_at(-100, sys.argv[1].encode(), b, ctypes.byref(m), 0) == 0:
    n, t = struct.unpack("<Ii", b.raw[:8]); print("FH_TYPE=%d" % t); print("FH_BYTES=%s" % b.raw[8:8 + n].hex())' "$LAB/secret.txt"
} >"$B/env"

# ---- run the battery inside the sandbox, under a pty
OUT=$RES/$LABEL.raw; ERR=$RES/$LABEL.err
{
  echo "cd $(printf %q "$WORK") || exit 1"
  echo "export BATTERY_DIR=$(printf %q "$B")"
  printf 'exec /usr/bin/python3 %q env ESCAPE_PARENT_SECRET=%q' "$LAB/leakfds.py" "${S[penv]}"
  for a in "$@"; do printf ' %q' "$a"; done
  printf ' bash %q >%q 2>%q\n' "$B/battery.sh" "$OUT" "$ERR"
} >"$RUN/inner.sh"
t0=$(date +%s%N)
script -qec "bash $RUN/inner.sh" /dev/null </dev/null >"$RUN/script.out" 2>&1
RC=$?
t1=$(date +%s%N)
sleep 2 # let anything that outlives the sandbox show itself

# ---- host-side verification of the [host-check] lines
N=$NONCE
canary() { [ "$(cat "$1" 2>/dev/null)" = "$N" ] && echo "host sees $1 = nonce"; }
host_check() { # prints a detail when the effect is visible on the host
  case "$1" in
    write_outside_dir)      canary "$LAB/canary-outside" ;;
    write_root_home)        canary "$HOSTHOME/.escape-canary" ;;
    write_tmp)              canary "/tmp/escape-canary-$N" ;;
    write_dev_shm)          canary "/dev/shm/escape-canary-$N" ;;
    write_npm_logs)         canary "$HOSTHOME/.npm/_logs/escape-canary" ;;
    write_symlink_in_work)  canary "$LAB/canary-symlink" ;;
    write_dotdot)           canary "$LAB/canary-dotdot" ;;
    write_proc_self_root)   canary "$LAB/canary-procroot" ;;
    write_rename_out)       canary "$LAB/canary-rename" ;;
    userns_remount_write)   canary "$LAB/canary-userns" ;;
    write_inherited_dir_fd) canary "$LAB/canary-fdleak" ;;
    write_hardlink_out)     grep -q "$N" "$LAB/hardlink-target.txt" && echo "host file $LAB/hardlink-target.txt modified" ;;
    chmod_outside)          [ "$(stat -c %a "$LAB/chmod-target.txt")" = 777 ] && echo "host file mode now 0777" ;;
    touch_outside)          [ "$(stat -c %Y "$LAB/chmod-target.txt")" -lt 1000000000 ] && echo "host file's mtime now $(stat -c %y "$LAB/chmod-target.txt")" ;;
    xattr_outside)          /usr/bin/python3 -c "import os,sys; sys.exit(0 if os.getxattr(sys.argv[1], 'user.escape') == b'$N' else 1)" "$LAB/chmod-target.txt" 2>/dev/null && echo "host file has user.escape = nonce" ;;
    chmod_suid_root)        f=$B/scratch/suid-true; [ -u "$f" ] && [ "$(stat -c %u "$f")" = 0 ] && echo "setuid-root binary $f left on host ($(stat -c '%A %U' "$f"))" ;;
    mknod_block_device)     [ -b "$B/scratch/blkdev" ] && echo "block device node $B/scratch/blkdev ($(stat -c '%t:%T' "$B/scratch/blkdev")) exists on host" ;;
    keyctl_add_key)         /usr/bin/python3 -c "
import ctypes,sys; l=ctypes.CDLL(None); l.syscall.restype=ctypes.c_long
sys.exit(0 if l.syscall(250,10,ctypes.c_long(-4),b'user',b'escape_added_$N',ctypes.c_long(0))>=0 else 1)" \
                              && echo "key escape_added_$N appeared in the host user's keyring" ;;
    daemon_setsid)          p=$(pgrep -f "sleep 999.$NONCE_NUM" | tr '\n' ' '); [ -n "$p" ] && echo "pid $p still running after the sandbox exited" ;;
    daemon_doublefork)      p=$(pgrep -f "sleep 998.$NONCE_NUM" | tr '\n' ' '); [ -n "$p" ] && echo "pid $p still running after the sandbox exited" ;;
    *) return 2 ;;
  esac
}
FINAL=$RES/$LABEL.txt
{
  echo "# label=$LABEL  sandbox: ${*:-<none>}"
  echo "# rc=$RC  wall=$(((t1 - t0) / 1000000))ms  nonce=$N  $(date -u +%FT%TZ)"
  grep -a '^#' "$OUT"
  grep -a -v '^#' "$OUT" | grep -a ': ' | while IFS= read -r line; do
    name=${line%%: *}
    d=$(host_check "$name"); hc=$?
    if [ $hc = 2 ]; then echo "$line"; continue; fi # decided inside
    if [ -n "$d" ]; then echo "$name: ESCAPED ($d)"
    elif [[ $line == *ESCAPED* ]]; then echo "$name: refused"; echo "[$name] inside op succeeded but host unaffected" >>"$B/battery.log"
    else echo "$name: refused"; fi
  done
} >"$FINAL"
n_total=$(grep -c -a -E '^[a-z0-9_]+: ' "$FINAL"); n_esc=$(grep -c -a ': ESCAPED' "$FINAL")
echo "# $n_esc of $n_total attacks ESCAPED" >>"$FINAL"
cp "$B/battery.log" "$RES/$LABEL.log" 2>/dev/null

# ---- clean up (only what this run started or planted)
for p in $(pgrep -f "sleep 99[89].$NONCE_NUM"); do kill -9 "$p" 2>/dev/null; done # they ignore TERM
kill "$HOSTD" 2>/dev/null; wait "$HOSTD" 2>/dev/null
/usr/bin/python3 -c "
import ctypes; l=ctypes.CDLL(None); l.syscall.restype=ctypes.c_long
k=l.syscall(250,10,ctypes.c_long(-4),b'user',b'escape_added_$N',ctypes.c_long(0))
k>=0 and l.syscall(250,3,ctypes.c_long(k))"
rm -f $CANARIES
cat "$FINAL"
