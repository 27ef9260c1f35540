// Package deptest holds the test that keeps Shoal's dependency direction
// (DESIGN.md, "Layout"): schemas imports nothing of ours and only the
// standard library; node, coordinator and bridge never import each other
// or broker; client imports only schemas; backends import only schemas and
// their interface package; production packages never import the test
// helpers under internal/; only cmd/ wires the parts together. Third-party
// libraries stay with their one user: the NATS server with broker, ZeroMQ
// and MCP's server side with bridge, MCP's client side with the local-model
// backend, ACP with the ACP backend, the Charm libraries with the TUI.
package deptest
