//go:build !linux

package proc

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
)

// SandboxSupport says this machine gives agents no kernel sandbox: the
// sandbox is Linux Landlock's.
func SandboxSupport() (string, error) {
	return "", fmt.Errorf("the sandbox needs Linux Landlock, and this node runs on %s", runtime.GOOS)
}

// RunSandbox refuses: there is nothing to confine with.
func RunSandbox([]string) int {
	fmt.Fprintf(os.Stderr, "shoal sandbox: the sandbox needs Linux Landlock, and this is %s; the agent does not run\n", runtime.GOOS)
	return 126
}

// NamespacesSupport says there are no namespaces here.
func NamespacesSupport() error {
	return fmt.Errorf("namespaces are Linux's, and this node runs on %s", runtime.GOOS)
}

// RunSandboxInit refuses: there is nothing to confine with.
func RunSandboxInit([]string) int { return RunSandbox(nil) }

// edge is a namespaced sandbox's edge, which only Linux has.
type edge struct{ theirs *os.File }

func newEdge(*Confinement, []string) (*edge, []string, error) { return nil, nil, NamespacesSupport() }
func (*edge) serve(<-chan struct{}) error                     { return NamespacesSupport() }
func (*edge) close()                                          {}

// nsAttr is never reached: newEdge refuses.
func nsAttr() *syscall.SysProcAttr { return sysProcAttr() }
