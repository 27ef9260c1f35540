// Package proc is the process kit every backend that runs a program uses:
// starting an agent's process with stdin deadlines and a stop ladder
// (Process, StartProcess), the node's reaper (Linux) and keepers (macOS)
// that hold an agent's whole process tree and end it with the agent or the
// node, the life tokens a restarted node reaps by, the sandbox
// (Confinement: Landlock and seccomp through a wrapper, RunSandbox, or
// around them namespaces of its own under an init, RunSandboxInit, whose
// edge the node serves), and the small helpers of the CLIs' environments
// and homes.
//
// It imports only schemas of Shoal's: the backend contract in node/backend
// names its types, never the other way round.
package proc
