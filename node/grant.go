package node

import (
	"cmp"
	"context"
	"time"

	"github.com/shoalfabric/shoal/node/backend"
	"github.com/shoalfabric/shoal/schemas"
)

// grantedEndpoint is the endpoint agents are pointed at under the
// coordinator's grant g: the node's key, and the endpoint unless this node
// was told of another way to it. Without a grant (the coordinator serves
// no endpoint with a token) it is only the way this node was told of, if
// any.
func (h *Host) grantedEndpoint(g *schemas.MCPGrant) backend.MCPEndpoint {
	if g == nil {
		return backend.MCPEndpoint{URL: h.cfg.MCP.URL}
	}
	return backend.MCPEndpoint{URL: cmp.Or(h.cfg.MCP.URL, g.URL), Token: g.Key}
}

// refreshGrant asks the coordinator, before an agent's life starts, for
// the node's way to its MCP endpoint as it is now. The grant of the
// node's hello does not outlive the coordinator: restarted with another
// --mcp-token (or with one where it had none) or listening elsewhere, it
// refuses the tokens made from the key given then, or is not there. A
// node that cannot ask keeps what it has, and says so.
func (h *Host) refreshGrant(ctx context.Context) {
	rs, ok := h.store.(*relayStore)
	if !h.granted || !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, grantWait)
	defer cancel()
	var rep schemas.RelayGrantReply
	if err := rs.ask(ctx, schemas.RelayGrant, nil, &rep); err != nil {
		h.log.Warn("could not ask the coordinator for its MCP endpoint as it is now; the agent is pointed at the one the node had", "err", err)
		return
	}
	e := h.grantedEndpoint(rep.MCP)
	h.mcpMu.Lock()
	changed := e != h.mcp
	h.mcp = e
	h.mcpMu.Unlock()
	if changed {
		h.log.Info("the coordinator's MCP endpoint or token changed; agents opened from now on reach it under the new one", "url", e.URL, "token", e.Token != "")
	}
}

// grantWait bounds a node's grant: past the relay's own wait for its
// endpoint to be listening (a coordinator that has just started).
const grantWait = 10 * time.Second
