package node

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// hostInfo describes this machine: its platform, CPUs, memory and GPUs.
func hostInfo() schemas.HostInfo {
	h := schemas.HostInfo{
		OS:           runtime.GOOS,
		Arch:         runtime.GOARCH,
		CPUs:         runtime.NumCPU(),
		MemoryBytes:  memoryBytes(),
		GPUs:         []string{},
		AppleSilicon: runtime.GOOS == "darwin" && runtime.GOARCH == "arm64",
	}
	h.Hostname, _ = os.Hostname()
	if h.AppleSilicon {
		h.GPUs = append(h.GPUs, "Apple silicon GPU (unified memory)")
	}
	// NVIDIA's driver lists each GPU under /proc/driver/nvidia/gpus.
	infos, _ := filepath.Glob("/proc/driver/nvidia/gpus/*/information")
	for _, p := range infos {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if model, ok := strings.CutPrefix(line, "Model:"); ok {
				h.GPUs = append(h.GPUs, strings.TrimSpace(model))
			}
		}
	}
	return h
}

// MachineMemory is the machine's memory in bytes, 0 when it cannot be read.
func MachineMemory() uint64 { return memoryBytes() }
