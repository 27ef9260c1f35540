// Package deptest holds the test that keeps Shoal's dependency direction
// (DESIGN.md, "Layout"): schemas imports nothing of ours and only the
// standard library; node and bridge never import each other or broker;
// backends import only schemas and their interface package; production
// packages never import the test helpers under internal/; only cmd/ wires
// the parts together.
package deptest
