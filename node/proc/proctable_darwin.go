//go:build darwin

package proc

import "golang.org/x/sys/unix"

// processTable is a snapshot of the machine's processes: each pid with
// its parent's, from sysctl kern.proc.all.
func processTable() (map[int]int, error) {
	procs, err := unix.SysctlKinfoProcSlice("kern.proc.all")
	if err != nil {
		return nil, err
	}
	table := make(map[int]int, len(procs))
	for _, p := range procs {
		table[int(p.Proc.P_pid)] = int(p.Eproc.Ppid)
	}
	return table, nil
}

// environHas reports whether a process started with key=value in its
// environment, from sysctl kern.procargs2 (the same user's processes
// only).
func environHas(pid int, key, value string) bool {
	b, err := unix.SysctlRaw("kern.procargs2", pid)
	if err != nil {
		return false
	}
	return procargsHas(b, key+"="+value)
}
