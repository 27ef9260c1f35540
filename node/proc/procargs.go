package proc

import (
	"bytes"
	"encoding/binary"
)

// procargsHas reads kern.procargs2's layout: argc (int32), the executable
// path, NUL padding, argc arguments, then the environment, each
// NUL-terminated.
func procargsHas(b []byte, want string) bool {
	if len(b) < 4 {
		return false
	}
	argc := int(binary.LittleEndian.Uint32(b))
	b = b[4:]
	i := bytes.IndexByte(b, 0) // the executable path
	if i < 0 {
		return false
	}
	b = b[i:]
	for len(b) > 0 && b[0] == 0 {
		b = b[1:]
	}
	for n := 0; len(b) > 0; n++ {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			i = len(b)
		}
		if n >= argc && i == 0 {
			return false // the end of the environment
		}
		if n >= argc && string(b[:i]) == want {
			return true
		}
		b = b[min(i+1, len(b)):]
	}
	return false
}
