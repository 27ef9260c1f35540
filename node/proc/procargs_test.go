package proc

import (
	"encoding/binary"
	"testing"
)

// procargs builds a kern.procargs2 buffer as macOS lays it out.
func procargs(exe string, args, env []string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(args)))
	b = append(b, exe...)
	b = append(b, 0, 0, 0, 0) // the path's NUL and its padding
	for _, a := range args {
		b = append(append(b, a...), 0)
	}
	for _, e := range env {
		b = append(append(b, e...), 0)
	}
	return append(b, 0, 0, 0) // the end of the environment, then the strings area's slack
}

// The keeper on macOS finds an agent's processes by their environment,
// read from kern.procargs2: only the environment counts, not an argument
// that happens to read the same.
func TestProcargsHas(t *testing.T) {
	b := procargs("/bin/sleep", []string{"sleep", "SHOAL_PROC=x1"}, []string{"HOME=/h", "SHOAL_PROC=a1", "PATH=/bin"})
	for want, has := range map[string]bool{
		"SHOAL_PROC=a1": true,
		"PATH=/bin":     true,
		"SHOAL_PROC=x1": false, // an argument, not the environment
		"SHOAL_PROC=a":  false,
		"":              false,
	} {
		if got := procargsHas(b, want); got != has {
			t.Errorf("procargsHas(%q) = %v, want %v", want, got, has)
		}
	}
	for _, short := range [][]byte{nil, {1, 0}, {1, 0, 0, 0, '/', 'x'}} {
		if procargsHas(short, "A=b") {
			t.Errorf("a truncated buffer %q matched", short)
		}
	}
}
