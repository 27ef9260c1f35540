#!/usr/bin/python3
"""leakfds.py CMD... : exec CMD with inheritable descriptors, as a careless
caller would leave them (LEAK_FDS=0 leaves none):
  fd 7 and fd 40 = connected unix sockets to hostd (a host service)
  fd 8 and fd 41 = directory descriptors of $LAB (outside the writable dir)
Some callers close the low numbers for their children and stop at the first
unused one, so 40 and 41 are what a caller that leaks high numbers hands on."""
import os, socket, sys
lab = os.environ["LAB"]
if os.environ.get("LEAK_FDS", "1") == "1":
    for sfd, dfd in ((7, 8), (40, 41)):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(os.path.join(lab, "run", "host.sock"))
        os.dup2(s.fileno(), sfd); s.close()
        d = os.open(lab, os.O_RDONLY | os.O_DIRECTORY); os.dup2(d, dfd); os.close(d)
        os.set_inheritable(sfd, True); os.set_inheritable(dfd, True)
os.execvp(sys.argv[1], sys.argv[1:])
