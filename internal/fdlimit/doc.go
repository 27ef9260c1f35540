// Package fdlimit reads how many files the process may have open, which
// every listener's connections and the store's files share: the NATS
// server takes clients up to half of it, the MCP endpoint and dashboard
// connections up to a quarter, and the rest is the store's.
package fdlimit
