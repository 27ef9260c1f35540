//go:build linux

package proc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A Reaper holds the processes of a node's agents, so that everything an
// agent starts, in whatever session or process group, ends with the agent
// and with its node. On Linux it is one process per node (`shoal
// __reaper`, RunReaper), a child subreaper: the agents' processes are its
// children, and what they leave behind is reparented to it, never to init.
// When a process it holds exits, it kills what that process started; when
// its lifeline to the node ends, however the node died, it kills all it
// holds and exits.
type Reaper struct {
	cmd      *exec.Cmd
	lifeline *os.File
	conn     *net.UnixConn
	gone     chan struct{} // closed when the reaper has exited

	mu      sync.Mutex
	next    int
	pending map[int]chan reaperReply
	procs   map[int]*Process
	early   map[int]syscall.WaitStatus // exits that came before the spawn's reply was taken
}

// reaperMsg is one message between a node and its reaper, with file
// descriptors alongside a spawn.
type reaperMsg struct {
	Op     string   `json:"op"` // spawn, kill (node → reaper); spawned, exited (reaper → node)
	ID     int      `json:"id,omitempty"`
	Argv   []string `json:"argv,omitempty"`
	Dir    string   `json:"dir,omitempty"`
	Env    []string `json:"env,omitempty"`
	PID    int      `json:"pid,omitempty"`
	Status int      `json:"status,omitempty"` // a wait status
	Error  string   `json:"error,omitempty"`
	// Namespaces starts the process as a sandbox's init, in namespaces
	// of its own (nsAttr), with a fourth descriptor, its edge.
	Namespaces bool `json:"ns,omitempty"`
}

type reaperReply struct {
	pid int
	err error
}

// ReaperArg is the argument that makes a shoal binary the reaper.
const ReaperArg = "__reaper"

// StartReaper starts the reaper of a node: exe is a binary that runs
// RunReaper when given ReaperArg (a shoal binary).
func StartReaper(exe string) (*Reaper, error) {
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		lifeR.Close()
		lifeW.Close()
		return nil, fmt.Errorf("the reaper's socket: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "reaper"), os.NewFile(uintptr(fds[1]), "node")
	defer theirs.Close()
	defer lifeR.Close()
	cmd := exec.Command(exe, ReaperArg)
	cmd.ExtraFiles = []*os.File{lifeR, theirs}
	cmd.Stderr = os.Stderr
	// Its own session: a signal to the node's group never reaches it, and
	// it outlives the node to end what the node leaves.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		ours.Close()
		lifeW.Close()
		return nil, fmt.Errorf("start the reaper (%s %s): %w", exe, ReaperArg, err)
	}
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		lifeW.Close()
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	r := &Reaper{cmd: cmd, lifeline: lifeW, conn: c.(*net.UnixConn), gone: make(chan struct{}),
		pending: map[int]chan reaperReply{}, procs: map[int]*Process{}, early: map[int]syscall.WaitStatus{}}
	go r.read()
	go func() {
		cmd.Wait()
		close(r.gone)
	}()
	return r, nil
}

// PID is the reaper's process id.
func (r *Reaper) PID() int { return r.cmd.Process.Pid }

// Gone reports whether the reaper has exited (been killed): the processes
// it held have died with it, and what they left in other sessions lives on.
func (r *Reaper) Gone() bool {
	select {
	case <-r.gone:
		return true
	default:
		return false
	}
}

// Done is closed when the reaper has exited.
func (r *Reaper) Done() <-chan struct{} { return r.gone }

// Close ends the lifeline: the reaper kills whatever it still holds and
// exits. It returns once the reaper has.
func (r *Reaper) Close() error {
	r.lifeline.Close()
	<-r.gone
	r.conn.Close()
	return nil
}

// read takes the reaper's messages until it is gone; then every process
// it held is over (the kernel killed the agents' processes with it).
func (r *Reaper) read() {
	buf := make([]byte, 64<<10)
	for {
		n, _, _, _, err := r.conn.ReadMsgUnix(buf, nil)
		if err != nil {
			break
		}
		var m reaperMsg
		if json.Unmarshal(buf[:n], &m) != nil {
			continue
		}
		switch m.Op {
		case "spawned":
			r.mu.Lock()
			ch := r.pending[m.ID]
			delete(r.pending, m.ID)
			r.mu.Unlock()
			if ch != nil {
				var err error
				if m.Error != "" {
					err = errors.New(m.Error)
				}
				ch <- reaperReply{pid: m.PID, err: err}
			}
		case "exited":
			ws := syscall.WaitStatus(m.Status)
			r.mu.Lock()
			p := r.procs[m.PID]
			delete(r.procs, m.PID)
			if p == nil {
				r.early[m.PID] = ws
			}
			r.mu.Unlock()
			if p != nil {
				p.exited(exitErr(ws))
			}
		}
	}
	// The connection ends with the reaper: once it is waited for, Gone
	// says so to whoever hears of these exits.
	<-r.gone
	r.mu.Lock()
	pending, procs := r.pending, r.procs
	r.pending, r.procs = map[int]chan reaperReply{}, map[int]*Process{}
	r.mu.Unlock()
	for _, ch := range pending {
		ch <- reaperReply{err: ErrReaperGone}
	}
	for _, p := range procs {
		p.exited(fmt.Errorf("%w, and the process with it", ErrReaperGone))
	}
}

func (r *Reaper) send(m reaperMsg, files ...*os.File) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = syscall.UnixRights(fds...)
	}
	_, _, err = r.conn.WriteMsgUnix(b, oob, nil)
	return err
}

// goneAfter reports whether a failed send to the reaper was its death.
// The socket breaks when the reaper's process ends, a moment before the
// wait for it returns, so a broken socket waits for that (bounded: a
// reaper that closed its end and lives on is not gone).
func (r *Reaper) goneAfter(err error) bool {
	if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, net.ErrClosed) {
		return r.Gone()
	}
	select {
	case <-r.gone:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

// start runs spec as a child of the reaper.
func (r *Reaper) start(spec ProcessSpec) (*Process, io.ReadCloser, error) {
	path, err := exec.LookPath(spec.Argv[0])
	if err != nil {
		return nil, nil, launchError(spec.Argv[0], err)
	}
	pipes, err := newPipes(spec.Sandbox != nil)
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	r.next++
	id := r.next
	ch := make(chan reaperReply, 1)
	r.pending[id] = ch
	r.mu.Unlock()
	argv := append([]string{path}, spec.Argv[1:]...)
	files := []*os.File{pipes.inR, pipes.outW, pipes.errW}
	if spec.edge != nil {
		files = append(files, spec.edge.theirs)
	}
	err = r.send(reaperMsg{Op: "spawn", ID: id, Argv: argv, Dir: spec.Dir, Env: spec.Env, Namespaces: spec.edge != nil}, files...)
	pipes.closeChildEnds() // the reaper has its own copies now
	if err != nil {
		r.mu.Lock()
		delete(r.pending, id)
		r.mu.Unlock()
		pipes.closeOurEnds()
		if r.goneAfter(err) {
			return nil, nil, fmt.Errorf("ask the reaper to start %s: %w", spec.Argv[0], ErrReaperGone)
		}
		return nil, nil, fmt.Errorf("ask the reaper to start %s: %w", spec.Argv[0], err)
	}
	var rep reaperReply
	select {
	case rep = <-ch:
	case <-r.gone:
		rep.err = ErrReaperGone
	}
	if rep.err != nil {
		pipes.closeOurEnds()
		if errors.Is(rep.err, ErrReaperGone) {
			return nil, nil, fmt.Errorf("start %s: %w", spec.Argv[0], rep.err)
		}
		return nil, nil, launchError(spec.Argv[0], rep.err)
	}
	pid := rep.pid
	p := newProcess(spec, pid, pipes,
		func(sig os.Signal) error { return syscall.Kill(pid, sig.(syscall.Signal)) },
		func() { r.send(reaperMsg{Op: "kill", PID: pid}) })
	r.mu.Lock()
	ws, early := r.early[pid]
	delete(r.early, pid)
	if !early {
		r.procs[pid] = p
	}
	r.mu.Unlock()
	if early {
		go p.exited(exitErr(ws))
	}
	return p, pipes.outR, nil
}

// RunReaper is the reaper process (see Reaper): a child subreaper that
// starts the processes its node asks for, on descriptor 4, and watches
// its lifeline, descriptor 3.
func RunReaper() int {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "reaper: cannot become a child subreaper:", err)
		return 1
	}
	lifeline := os.NewFile(3, "lifeline")
	ctl := os.NewFile(4, "node")
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	c, err := net.FileConn(ctl)
	ctl.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "reaper: no node socket:", err)
		return 1
	}
	rp := &reaping{conn: c.(*net.UnixConn), leaders: map[int]string{}}
	gone := make(chan struct{})
	go func() {
		io.Copy(io.Discard, lifeline)
		close(gone)
	}()
	reqs := make(chan reaperRequest)
	go rp.requests(reqs)
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	// SIGINT and SIGTERM meant for the node's terminal or service are not
	// the reaper's to obey: it ends when the node does.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	for {
		select {
		case req, ok := <-reqs:
			if !ok {
				reqs = nil // the node closed its socket: wait for the lifeline
				continue
			}
			rp.handle(req)
		case <-chld:
			rp.reap()
		case <-gone:
			// The node is gone: everything below the reaper goes.
			self := os.Getpid()
			killWhere(func(table map[int]int) []int { return descendants(table, self) }, rp.reapQuietly)
			return 0
		}
	}
}

// reaperRequest is a message from the node, with its descriptors.
type reaperRequest struct {
	msg   reaperMsg
	files []*os.File
}

// reaping is the reaper's state.
type reaping struct {
	conn    *net.UnixConn
	leaders map[int]string // the processes the node asked for, by pid, with their tokens
}

func (rp *reaping) requests(out chan<- reaperRequest) {
	defer close(out)
	buf := make([]byte, 1<<20)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := rp.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		var req reaperRequest
		if json.Unmarshal(buf[:n], &req.msg) != nil {
			continue
		}
		if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if fds, err := syscall.ParseUnixRights(&m); err == nil {
					for _, fd := range fds {
						req.files = append(req.files, os.NewFile(uintptr(fd), "fd"))
					}
				}
			}
		}
		out <- req
	}
}

func (rp *reaping) reply(m reaperMsg) {
	b, _ := json.Marshal(m)
	rp.conn.WriteMsgUnix(b, nil, nil)
}

func (rp *reaping) handle(req reaperRequest) {
	defer func() {
		for _, f := range req.files {
			f.Close()
		}
	}()
	switch req.msg.Op {
	case "spawn":
		want := 3
		// Its own group, as every agent's; and if the reaper itself is
		// killed, the kernel kills the process with it.
		sys := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if req.msg.Namespaces {
			want, sys = 4, nsAttr()
		}
		if len(req.files) != want || len(req.msg.Argv) == 0 {
			rp.reply(reaperMsg{Op: "spawned", ID: req.msg.ID, Error: fmt.Sprintf("a spawn needs a command and %d descriptors", want)})
			return
		}
		token := newToken()
		proc, err := os.StartProcess(req.msg.Argv[0], req.msg.Argv, &os.ProcAttr{
			Dir:   req.msg.Dir,
			Env:   append(append([]string(nil), req.msg.Env...), procEnv+"="+token),
			Files: req.files,
			Sys:   sys,
		})
		if err != nil {
			rp.reply(reaperMsg{Op: "spawned", ID: req.msg.ID, Error: err.Error()})
			return
		}
		pid := proc.Pid
		rp.leaders[pid] = token
		proc.Release() // waited for by reap, with every other child
		rp.reply(reaperMsg{Op: "spawned", ID: req.msg.ID, PID: pid})
	case "kill":
		if token, ok := rp.leaders[req.msg.PID]; ok {
			syscall.Kill(req.msg.PID, syscall.SIGKILL)
			rp.killTree(token)
		}
	}
}

// reap waits for every child that has exited. A process the node asked
// for takes what it started with it, then its exit is reported. The
// trees of all the leaders found exited are killed together, in one walk
// of the process table per round: many agents closed at once cost one
// walk, not one each.
func (rp *reaping) reap() {
	var exited []reaperMsg
	tokens := map[string]bool{}
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			break
		}
		token, ok := rp.leaders[pid]
		if !ok {
			continue // something an agent left behind, reparented here
		}
		delete(rp.leaders, pid)
		tokens[token] = true
		exited = append(exited, reaperMsg{Op: "exited", PID: pid, Status: int(ws)})
	}
	if len(tokens) == 0 {
		return
	}
	rp.killTrees(tokens)
	for _, m := range exited {
		rp.reply(m)
	}
}

// reapQuietly waits for exited children without reporting them.
func (rp *reaping) reapQuietly() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// killTree kills every process below the reaper that carries token, what
// one process the node asked for started, wherever it went since.
func (rp *reaping) killTree(token string) { rp.killTrees(map[string]bool{token: true}) }

// killTrees is killTree for several tokens at once.
func (rp *reaping) killTrees(tokens map[string]bool) {
	self := os.Getpid()
	killWhere(func(table map[int]int) []int {
		var out []int
		for _, pid := range descendants(table, self) {
			if v, ok := environValue(pid, procEnv); ok && tokens[v] {
				out = append(out, pid)
			}
		}
		return out
	}, func() {
		// Waiting here may take a leader's exit: it is reported when its
		// own turn comes, through the next SIGCHLD.
		rp.reapOthers()
	})
}

// reapOthers waits for exited children that are not leaders, so killed
// processes do not linger as zombies while a tree is killed.
func (rp *reaping) reapOthers() {
	table, err := processTable()
	if err != nil {
		return
	}
	self := os.Getpid()
	for pid, ppid := range table {
		if ppid != self {
			continue
		}
		if _, leader := rp.leaders[pid]; leader {
			continue
		}
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
}

// exitErr is nil for a clean exit, else the ExitStatus.
func exitErr(ws syscall.WaitStatus) error {
	if ws.Exited() && ws.ExitStatus() == 0 {
		return nil
	}
	return &ExitStatus{ws}
}
