// Package backend is the contract between the node and the agent
// backends: Backend starts a Session from a Spec and delivers its events
// to a Sink; the optional interfaces a backend may implement (ModelSetter,
// Checker, Confiner, Describer, ManyDescriber) and the Asker through which
// an agent's permission requests reach a person. One package per backend
// kind lives beneath it (claude, acp, local). The process kit those
// backends run programs with is node/proc.
//
// Backends import this package, node/proc and schemas, never each other.
package backend
