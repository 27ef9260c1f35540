package schemas

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// NodeKey is what a node holds to give each of its agents an MCP identity
// of its own: derived from the endpoint's token and the node's name. A
// node never holds the endpoint's token itself (a person's), and its key
// makes tokens the endpoint accepts only for agents placed on that node
// (AgentToken, EndpointAgentToken).
func NodeKey(endpointToken, node string) string {
	if endpointToken == "" {
		return ""
	}
	mac := hmac.New(sha256.New, []byte("shoal node key\x00"+endpointToken))
	mac.Write([]byte(node))
	return nodeKeyPrefix + hex.EncodeToString(mac.Sum(nil))
}

// nodeKeyPrefix begins every node's key.
const nodeKeyPrefix = "node-"

// AgentToken is the bearer token one life of an agent presents at the
// coordinator's MCP endpoint when the endpoint has a token: derived by the
// agent's node from its key (NodeKey), the agent's id and the request id
// of the open that began this life. It names that agent only, and only
// while that life's record stands and names that node.
func AgentToken(nodeKey, agent, openRequestID string) string {
	mac := hmac.New(sha256.New, []byte("shoal agent token\x00"+nodeKey))
	mac.Write([]byte(agent + "\x00" + openRequestID))
	return agentTokenPrefix + hex.EncodeToString(mac.Sum(nil))
}

// EndpointAgentToken is the token the endpoint expects of a life of an
// agent whose record names node and openRequestID.
func EndpointAgentToken(endpointToken, node, agent, openRequestID string) string {
	return AgentToken(NodeKey(endpointToken, node), agent, openRequestID)
}

// agentTokenPrefix begins every agent's token.
const agentTokenPrefix = "agent-"

// IsAgentToken reports whether a bearer token has the form of an agent's
// own (AgentToken): it names an agent, never a person.
func IsAgentToken(token string) bool { return strings.HasPrefix(token, agentTokenPrefix) }

// IsNodeKey reports whether a bearer token has the form of a node's key
// (NodeKey): it is no credential at the endpoint.
func IsNodeKey(token string) bool { return strings.HasPrefix(token, nodeKeyPrefix) }
