//go:build unix

package proc

import (
	"syscall"
	"time"
)

// Environment variables that mark an agent's processes, inherited by
// everything they start, so that a process that left the agent's session
// and process group is still known as the agent's.
const (
	// LifeEnv holds a token of one life of one agent, set by the node for
	// every process of the agent; a restarted node reaps by it.
	LifeEnv = "SHOAL_AGENT_LIFE"
	// procEnv holds a token of one process the reaper started, so that
	// when it exits what it started is ended too.
	procEnv = "SHOAL_PROC"
)

// descendants lists the processes below root in table, deepest last.
func descendants(table map[int]int, root int) []int {
	children := map[int][]int{}
	for pid, ppid := range table {
		children[ppid] = append(children[ppid], pid)
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if c != root {
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out
}

// killWhere SIGKILLs, again and again, every process pick chooses from a
// fresh snapshot of the process table, until a snapshot has none left
// (or a few seconds pass), calling reap between rounds so that the killed
// can be waited for. It returns how many it killed. Since a snapshot is
// taken anew each round, a process forked by one being killed is caught
// in the next.
func killWhere(pick func(table map[int]int) []int, reap func()) int {
	killed := map[int]bool{}
	deadline := time.Now().Add(5 * time.Second)
	for delay := time.Millisecond; time.Now().Before(deadline); delay = min(2*delay, 50*time.Millisecond) {
		table, err := processTable()
		if err != nil {
			return len(killed)
		}
		left := 0
		for _, pid := range pick(table) {
			if pid <= 1 || pid == syscall.Getpid() {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed[pid] = true
				left++
			}
		}
		if reap != nil {
			reap()
		}
		if left == 0 {
			break
		}
		time.Sleep(delay)
	}
	return len(killed)
}

// marked picks the processes of table, among those under root (every
// process when root is 0), whose environment has key=value.
func marked(root int, key, value string) func(map[int]int) []int {
	return func(table map[int]int) []int {
		var pids []int
		if root > 0 {
			pids = descendants(table, root)
		} else {
			for pid := range table {
				pids = append(pids, pid)
			}
		}
		var out []int
		for _, pid := range pids {
			if environHas(pid, key, value) {
				out = append(out, pid)
			}
		}
		return out
	}
}

// ReapLife kills every process on the machine that belongs to the agent
// life token names (see LifeEnv): what a node that died, with the process
// that held its agents, left running. It returns how many it killed.
func ReapLife(token string) int {
	if token == "" {
		return 0
	}
	return killWhere(marked(0, LifeEnv, token), nil)
}
