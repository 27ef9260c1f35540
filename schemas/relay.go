package schemas

import "encoding/json"

// RelayHelloReply answers a confined node's first word to the relay.
type RelayHelloReply struct {
	// NameTaken says a running node already answers to this name.
	NameTaken bool `json:"name_taken"`
	// NodeTTLMS is how long a node's heartbeat entry lives, in
	// milliseconds; the node beats several times within it.
	NodeTTLMS int64 `json:"node_ttl_ms"`
	// MCP, when the coordinator serves an MCP endpoint with a token, is
	// what the node needs to give its agents their own MCP identities.
	MCP *MCPGrant `json:"mcp,omitempty"`
	// TakesAcked says the relay reads HeaderAcked on the node's events
	// (a relay of an earlier version refuses an event that carries it).
	TakesAcked bool `json:"takes_acked,omitempty"`
	// Instance is the life (NodeRecord.Instance) whose heartbeat the
	// nodes bucket holds under this name now, if any: a node back from
	// past its TTL whose name another life took since finds it here.
	Instance string `json:"instance,omitempty"`
	// Grants says the relay answers RelayGrant (a relay of an earlier
	// version leaves it unanswered).
	Grants bool `json:"grants,omitempty"`
}

// RelayGrantReply answers RelayGrant: the node's way to the coordinator's
// MCP endpoint as it is now, or none when the coordinator serves no
// endpoint with a token.
type RelayGrantReply struct {
	MCP *MCPGrant `json:"mcp,omitempty"`
}

// MCPGrant is a node's way to the coordinator's MCP endpoint: where it is
// and the node's key (NodeKey), from which the node derives each agent's
// token (AgentToken).
type MCPGrant struct {
	URL string `json:"url"`
	Key string `json:"key"`
}

// RelayEntry is an agent record as the agents bucket holds it.
type RelayEntry struct {
	Found    bool            `json:"found"`
	Revision uint64          `json:"revision,omitempty"`
	Value    json.RawMessage `json:"value,omitempty"`
}

// RelayOwnedRequest asks for a page of the records a node owns, by id,
// starting after After. A node of an earlier version asks without Paged,
// and is answered every record at once.
type RelayOwnedRequest struct {
	Paged bool   `json:"paged,omitempty"`
	After string `json:"after,omitempty"`
	// Max is the largest message the node's own connection takes (a
	// leaf server's may be smaller than the relay's); the relay's when 0.
	Max int64 `json:"max,omitempty"`
}

// RelayOwnedReply lists the records a node owns: all of them, or a page
// that fits half a message, Next naming the id the next starts after.
type RelayOwnedReply struct {
	Records []RelayEntry `json:"records"`
	Next    string       `json:"next,omitempty"`
}

// RelayLastRequest asks for the last stored event numbers of agents, at
// most MaxRelayLast of them.
type RelayLastRequest struct {
	Agents []string `json:"agents"`
}

// MaxAgentRecordBytes is the most an agent record a node writes through
// the relay holds, encoded: the relay refuses a larger one.
const MaxAgentRecordBytes = 256 << 10

// MaxRelayLast is the most agents one RelayLastRequest names: the relay
// reads each one's record and stream, and refuses a request naming more.
const MaxRelayLast = 1024

// RelayLastReply maps each agent the node owns to its last stored event
// number (0 when none is stored) and to how its stream ends. Agents it
// does not own are left out.
type RelayLastReply struct {
	Last  map[string]uint64 `json:"last"`
	Tails map[string]Tail   `json:"tails,omitempty"`
}

// RelayRefused is the JetStream API error code the relay answers a write
// with when the node may not make it (an agent it does not own, a header
// it may not set). It is final: sending the write again changes nothing.
const RelayRefused = 403

// RelayBundleRequest asks for the chunk at Offset of bundle Name.
type RelayBundleRequest struct {
	Name   string `json:"name"`
	Offset int64  `json:"offset"`
}
