// Package deptest holds the test that keeps Shoal's dependency direction
// (the README's "Layout"): schemas imports nothing of ours and only the
// standard library, and schemas/validate only schemas and its JSON Schema
// library; node, coordinator and bridge never import each other or
// broker; client imports only schemas and service; service only schemas
// and schemas/validate; node/backend only schemas and node/proc, node/proc
// only schemas, and each backend only schemas, node/backend and node/proc;
// workspace (git for agents on a repository, not yet wired in) only schemas;
// production packages never import the test helpers under internal/; only
// cmd/ wires the parts together. Third-party libraries stay with their one
// user: the NATS server with broker, ZeroMQ and MCP's server side with
// bridge, MCP's client side with the local-model backend, ACP with the ACP
// backend, Landlock with the process kit, the Charm libraries with the TUI.
package deptest
