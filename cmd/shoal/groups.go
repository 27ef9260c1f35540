package main

// Each command's flags, by topic: the groups of its help, and which flags
// are settings.
//
// A setting describes the machine or the user, not one invocation: where
// the fabric is, how a daemon runs. It is read from the config file and
// from SHOAL_<NAME> as well as from the command line, and a name means one
// thing in every command that has it. Every other flag is an argument of
// the invocation it is given to (an agent's id, --json, a timeout), read
// from the command line only, so an exported variable cannot change what
// a verb does.
//
// A flag a command registers must be in one of its groups; the help test
// fails otherwise, naming the flag.

// flagGroup is one topic of a command's help.
type flagGroup struct {
	title   string
	setting bool // its flags are settings
	flags   []string
}

var (
	connectionGroup = flagGroup{"Fabric connection", true, []string{"nats", "creds", "tls-ca", "tls-cert", "tls-key"}}
	requestGroup    = flagGroup{"This request", false, []string{"json", "timeout"}}
	configGroup     = flagGroup{"Configuration", false, []string{"config"}}
	loggingGroup    = flagGroup{"Logging", true, []string{"log-level", "log-format"}}

	nodeFlags = []string{"node-name", "dir", "labels", "max-agents", "refresh", "keep-for", "mcp-url", "outbox-memory", "outbox-disk", "publish"}
)

// nodeGroups are the node's groups, for shoal node and the local node of
// shoal up, the first with a title of its own and more flags.
func nodeGroups(title string, more ...string) []flagGroup {
	return []flagGroup{
		{title, true, append(more, nodeFlags...)},
		{"Agent CLIs", true, []string{"claude", "opencode", "claude-agent-acp", "gemini"}},
		{"Turns", true, []string{"turn-idle-timeout", "turn-timeout", "interrupt-grace", "stop-wait", "image-max-long-edge"}},
		{"Sandbox", true, []string{"sandbox", "sandbox-kind"}},
	}
}

// verbGroups are a client verb's own groups, then the ones every verb has.
func verbGroups(own ...flagGroup) []flagGroup {
	return append(own, requestGroup, connectionGroup, configGroup)
}

// groupsByCommand are the groups of each command, in help order.
var groupsByCommand = map[string][]flagGroup{
	"up": concat([]flagGroup{
		{"NATS server", true, []string{"host", "port", "store", "max-payload", "memory-limit"}},
		{"Authentication and TLS", true, []string{"auth", "auth-dir", "tls-cert", "tls-key", "tls-ca", "tls-verify-clients"}},
		{"Leaf nodes and cluster", true, []string{"leaf-listen", "cluster", "cluster-listen", "routes", "server-name"}},
		// --nats is read from shoal up's command line only: a nats in the
		// environment or the config file is where the fabric listens
		// (settings.go, fabricAddress).
		{"A NATS deployment instead of the embedded server", false, []string{"nats"}},
		{"Its credentials there", true, []string{"creds"}},
		{"Stream and buckets", true, []string{"stream-max-age", "stream-max-bytes", "repos-max-bytes", "stream-duplicates", "replicas", "node-ttl"}},
		{"MCP endpoint and web dashboard", true, []string{"mcp-listen", "mcp-token", "mcp-observer-token", "public-url", "max-depth", "no-mcp", "no-web"}},
		{"Kaimon bus", true, []string{"bus", "no-bus"}},
		{"Monitoring", true, []string{"monitor", "metrics"}},
		// The fleet's budget, set at each start (shoal budget set --fleet
		// changes it while up runs); not a setting: --budget-tokens of
		// shoal open is an agent's.
		{"Fleet budget", false, []string{"budget-tokens", "budget-usd"}},
	}, nodeGroups("Local node", "no-node"), []flagGroup{loggingGroup, configGroup}),
	"node": concat([]flagGroup{
		{"Fabric connection", true, []string{"nats", "leaf", "creds", "tls-ca", "tls-cert", "tls-key", "mcp-token"}},
		{"Monitoring", true, []string{"metrics"}},
	}, nodeGroups("Node"), []flagGroup{loggingGroup, configGroup}),
	"creds": {
		{"Credentials", false, []string{"out", "force", "expires"}},
		{"Signing keys", true, []string{"auth-dir"}},
		configGroup,
	},
	"open": verbGroups(
		flagGroup{"Agent", false, []string{"model", "effort", "id", "system-prompt", "mcp-config"}},
		flagGroup{"Permissions", false, []string{"permission", "permission-mode", "allow", "only", "disallow", "allow-nested", "reach", "ask", "ask-timeout"}},
		flagGroup{"Placement", false, []string{"node", "labels"}},
		flagGroup{"Budget", false, []string{"budget-tokens", "budget-usd"}},
		flagGroup{"Sandbox", false, []string{"sandbox", "sandbox-kind", "sandbox-net"}},
		flagGroup{"Repository", false, []string{"repo", "ref", "with-changes"}},
	),
	"diff":  verbGroups(flagGroup{"Diff", false, []string{"stat"}}),
	"fetch": verbGroups(flagGroup{"Fetch", false, []string{"into", "force"}}),
	"job": verbGroups(
		flagGroup{"Repository", false, []string{"repo", "ref", "with-changes"}},
		flagGroup{"Agent", false, []string{"model", "permission", "then", "wait", "detach"}},
		flagGroup{"Placement", false, []string{"node", "labels", "sandbox"}},
	),
	"send":      verbGroups(),
	"run":       verbGroups(flagGroup{"Run", false, []string{"wait"}}),
	"output":    verbGroups(flagGroup{"Output", false, []string{"turn", "which", "tools", "max-chars"}}),
	"status":    verbGroups(),
	"ls":        verbGroups(),
	"nodes":     verbGroups(),
	"interrupt": verbGroups(),
	"set-model": verbGroups(),
	"close":     verbGroups(),
	"permit":    verbGroups(flagGroup{"Answer", false, []string{"message", "option", "input"}}),
	"pending":   verbGroups(),
	"tail":      verbGroups(flagGroup{"Replay", false, []string{"from", "no-follow", "thoughts", "raw", "numbers"}}),
	"watch":     verbGroups(flagGroup{"Watch", false, []string{"exec"}}),
	"usage":     verbGroups(flagGroup{"Usage", false, []string{"by", "since"}}),
	"budget":    verbGroups(flagGroup{"Budget", false, []string{"fleet", "label", "tokens", "usd"}}),
	"tui":       verbGroups(flagGroup{"Display", false, []string{"silent", "poll"}}),
	"mcp": {
		{"This server", false, []string{"timeout"}},
		connectionGroup,
		configGroup,
	},
	"bench": {
		{"Load", false, []string{"nodes", "agents", "events", "turns", "rate", "fleet", "fleet-opens", "short", "publish"}},
		{"Fabric", false, []string{"nats"}},
		{"Output", false, []string{"json", "profile"}},
		configGroup,
	},
	"config":     {configGroup},
	"completion": {{"Completion words", false, []string{"words"}}, connectionGroup, configGroup},
	"version":    {configGroup},
}

// renamedFlags are old spellings a command still accepts, hidden from its
// help: old flag name → the flag that replaced it. The old name is read
// from the command line, the config file and SHOAL_<OLD> alike, below the
// new one.
var renamedFlags = map[string]map[string]string{
	"node": {"name": "node-name"},
}

func concat(parts ...[]flagGroup) []flagGroup {
	var out []flagGroup
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// groups are the command's help groups.
func (c *command) groups() []flagGroup { return groupsByCommand[c.name] }

// isSetting reports whether the command's flag name is a setting.
func (c *command) isSetting(name string) bool {
	for _, g := range c.groups() {
		for _, f := range g.flags {
			if f == name {
				return g.setting
			}
		}
	}
	return false
}

// renamed is the flag that replaced the command's old flag name, or "".
func (c *command) renamed(name string) string { return renamedFlags[c.name][name] }
