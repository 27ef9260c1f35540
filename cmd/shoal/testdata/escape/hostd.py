#!/usr/bin/python3
"""Host-side fixtures for battery.sh. Runs OUTSIDE any sandbox.

usage: hostd.py OUT_ENV_FILE READY_FILE UNIX_SOCKET_PATH
Secrets are read from the environment (S_net, S_victim, S_pty, S_shm, S_mq,
S_kmsg, S_keyu, S_keys) - set by run-battery.sh.  Serves/plants:
  TCP 127.0.0.1:P and [::1]:P  (sends an HTTP-ish reply containing S_net)
  UDP 127.0.0.1:U              (answers any datagram with S_net)
  unix UNIX_SOCKET_PATH and abstract @escape-host-NONCE (send S_net)
  victim process with S_victim in its environment
  pty pair with S_pty queued as input on the slave side
  SysV shm segment (key SHM_KEY) holding S_shm, POSIX mq holding S_mq
  kmsg line with S_kmsg, keys in the user (@u) and session (@s) keyrings
Writes the variables the battery needs to OUT_ENV_FILE, then touches
READY_FILE.  On SIGTERM removes everything it created.
"""
import ctypes, os, signal, socket, subprocess, sys, threading, time

OUT, READY, UPATH = sys.argv[1], sys.argv[2], sys.argv[3]
E = os.environ
NONCE = E["NONCE"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
cleanup = []
env = {}


def serve_stream(sock):
    payload = (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
               b"Connection: close\r\n\r\n%s\n" % (len(E["S_net"]) + 1, E["S_net"].encode()))
    while True:
        try:
            c, _ = sock.accept()
        except OSError:
            return
        try:
            c.settimeout(0.3)
            try:
                c.recv(4096)
            except OSError:
                pass
            c.sendall(payload)
        except OSError:
            pass
        finally:
            c.close()


def bg(fn, *a):
    t = threading.Thread(target=fn, args=a, daemon=True)
    t.start()


# --- TCP v4 + v6 on the same port ---------------------------------------
s4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s4.setsockopt(socket.IPPROTO_TCP, socket.TCP_FASTOPEN, 16)
except OSError:
    pass
s4.bind(("127.0.0.1", 0))
s4.listen(64)
port = s4.getsockname()[1]
bg(serve_stream, s4)
env["TCPPORT"] = port
try:
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s6.bind(("::1", port))
    s6.listen(64)
    bg(serve_stream, s6)
except OSError as e:
    print("hostd: no ::1 listener:", e, file=sys.stderr)

# --- UDP ----------------------------------------------------------------
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))
env["UDPPORT"] = u.getsockname()[1]


def serve_udp():
    while True:
        try:
            _, addr = u.recvfrom(4096)
            u.sendto(E["S_net"].encode(), addr)
        except OSError:
            return


bg(serve_udp)

# --- unix path + abstract ---------------------------------------------------
upath = UPATH
try:
    os.unlink(upath)
except FileNotFoundError:
    pass
us = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
us.bind(upath)
os.chmod(upath, 0o777)
us.listen(16)
bg(serve_stream, us)
cleanup.append(lambda: os.unlink(upath))
env["UNIXPATH"] = upath
aname = "escape-host-" + NONCE
ua = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
ua.bind("\0" + aname)
ua.listen(16)
bg(serve_stream, ua)
env["ABSTRACT"] = aname

# --- victim process with a secret in its environment -----------------------
victim = subprocess.Popen(["/bin/sleep", "3600.%s" % E["NONCE_NUM"]],
                          env={"PATH": "/usr/bin:/bin", "ESCAPE_VICTIM": E["S_victim"]},
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
env["VICTIM_PID"] = victim.pid
cleanup.append(lambda: (victim.kill(), victim.wait()))

# --- a pty whose slave has the secret queued as input ------------------------
m, sl = os.openpty()
env["HOST_PTS"] = os.ttyname(sl)
os.write(m, E["S_pty"].encode() + b"\n")

# --- SysV shm ---------------------------------------------------------------
IPC_CREAT, IPC_RMID = 0o1000, 0
libc.shmat.restype = ctypes.c_void_p
shm_key = 0x5A1A0000 + (int(E["NONCE_NUM"]) % 0xFFFF)
shmid = libc.shmget(shm_key, 4096, IPC_CREAT | 0o600)
if shmid >= 0:
    addr = libc.shmat(shmid, None, 0)
    data = E["S_shm"].encode() + b"\0"
    ctypes.memmove(addr, data, len(data))
    libc.shmdt(ctypes.c_void_p(addr))
    env["SHM_KEY"] = shm_key
    cleanup.append(lambda: libc.shmctl(shmid, IPC_RMID, None))
else:
    print("hostd: shmget failed", ctypes.get_errno(), file=sys.stderr)


# --- POSIX message queue -------------------------------------------------------
class MqAttr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long),
                ("pad", ctypes.c_long * 4)]


mqname = ("/escape-" + NONCE).encode()
attr = MqAttr(0, 4, 128, 0)
mqd = libc.mq_open(mqname, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
if mqd >= 0:
    msg = E["S_mq"].encode()
    libc.mq_send(mqd, msg, len(msg), 0)
    env["MQ_NAME"] = mqname.decode()
    cleanup.append(lambda: libc.mq_unlink(mqname))
else:
    print("hostd: mq_open failed", ctypes.get_errno(), file=sys.stderr)

# --- kmsg ----------------------------------------------------------------------
try:
    with open("/dev/kmsg", "w") as k:
        k.write("escape marker %s\n" % E["S_kmsg"])
except OSError as e:
    print("hostd: kmsg:", e, file=sys.stderr)

# --- keyrings ---------------------------------------------------------------------
SYS_add_key, SYS_keyctl = 248, 250
KEY_SPEC_SESSION, KEY_SPEC_USER = -3, -4
for spec, desc, val in ((KEY_SPEC_USER, "escape_user_" + NONCE, E["S_keyu"]),
                        (KEY_SPEC_SESSION, "escape_sess_" + NONCE, E["S_keys"])):
    kid = libc.syscall(SYS_add_key, b"user", desc.encode(), val.encode(),
                       ctypes.c_size_t(len(val)), ctypes.c_int(spec))
    if kid < 0:
        print("hostd: add_key", desc, "errno", ctypes.get_errno(), file=sys.stderr)
    else:
        cleanup.append(lambda kid=kid: libc.syscall(SYS_keyctl, 3, ctypes.c_long(kid)))  # revoke

# --- host namespace identities ------------------------------------------------------
for ns in ("net", "mnt", "pid", "ipc", "uts", "user", "cgroup"):
    env["HOST_NS_" + ns] = os.readlink("/proc/self/ns/" + ns)
env["HOST_HOSTNAME"] = socket.gethostname()


def stop(*_):
    for f in reversed(cleanup):
        try:
            f()
        except Exception:
            pass
    os._exit(0)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
with open(OUT, "w") as f:
    for k, v in env.items():
        f.write("%s='%s'\n" % (k, v))
open(READY, "w").close()
while True:
    time.sleep(3600)
