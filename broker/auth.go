package broker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/shoalfabric/shoal/schemas"
)

// Role is what a credential lets its holder do in the fabric.
type Role string

// The roles Shoal issues credentials for.
const (
	// RoleCoordinator may do anything in the fabric's account: the
	// coordinator's own connections, and `shoal up --nats` against a NATS
	// deployment someone else runs.
	RoleCoordinator Role = "coordinator"
	// RoleNode answers its own control subjects and reaches the fabric's
	// state only through the coordinator's relay, for agents it owns.
	RoleNode Role = "node"
	// RoleClient drives agents through the coordinator (the command line,
	// `shoal mcp`, the TUI).
	RoleClient Role = "client"
	// RoleObserver watches and replays agents and reads their status; it
	// cannot open, drive or close them.
	RoleObserver Role = "observer"
	// RoleSystem is a user of the NATS system account, not of the fabric's:
	// the server's monitoring requests ($SYS.REQ.…) that `nats server
	// info|list|report`, surveyors and exporters make. It may not kick
	// clients, put a server in lame duck mode, reload it or push account
	// claims.
	RoleSystem Role = "system"
)

// Roles lists the roles, for help texts.
var Roles = []Role{RoleNode, RoleClient, RoleObserver, RoleCoordinator, RoleSystem}

// ParseRole reads a role name.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("unknown role %q (want node, client, observer, coordinator or system)", s)
}

// permissions returns what a credential of role may publish and receive.
// Scoped roles get no JetStream API at all: JetStream answers a request on
// whatever reply subject the requester names, so a client allowed any
// JetStream request could make the server write into the stream or onto
// another node's control subjects. They go through the coordinator, which
// only replies under _INBOX.
func permissions(role Role, name string) jwt.Permissions {
	var p jwt.Permissions
	inbox := schemas.InboxPrefix(string(role), name) + ".>"
	switch role {
	case RoleCoordinator:
		return p // no limits within the account
	case RoleSystem:
		// Monitoring requests only, none that change a server; every
		// reply and event may be received.
		p.Pub.Allow.Add("$SYS.REQ.>")
		p.Pub.Deny.Add("$SYS.REQ.SERVER.*.KICK", "$SYS.REQ.SERVER.*.LDM", "$SYS.REQ.SERVER.*.RELOAD",
			"$SYS.REQ.CLAIMS.>", "$SYS.REQ.ACCOUNT.*.CLAIMS.>")
		return p
	case RoleNode:
		p.Pub.Allow.Add(schemas.RelayNamespace(name), schemas.NodeReplyPrefix(name)+".>")
		p.Sub.Allow.Add(schemas.NodeGroup(name)+".>", "$SRV.>", inbox)
		// Answering a request to its endpoints needs no publish right
		// beyond the one reply.
		p.Resp = &jwt.ResponsePermission{MaxMsgs: 1}
	case RoleClient:
		p.Pub.Allow.Add(schemas.FabricPrefix+".>", schemas.ReplayAckPrefix+".>")
		p.Sub.Allow.Add(schemas.EventSubjects, inbox)
	case RoleObserver:
		for _, v := range schemas.FabricReadVerbs() {
			p.Pub.Allow.Add(schemas.FabricSubject(v))
		}
		p.Pub.Allow.Add(schemas.ReplayAckPrefix + ".>")
		p.Sub.Allow.Add(schemas.EventSubjects, inbox)
	}
	// A client or an observer answers only a replay's flow control
	// (schemas.ReplayAckPrefix): with the right to answer what it receives,
	// it could answer the events of agent.*, whose reply subjects are
	// their publishers' acknowledgements, and forge them.
	return p
}

// Authority issues the fabric's credentials. It holds a NATS operator, the
// system account SYS (whose key signs system users) and the fabric's
// account SHOAL, whose key signs every other user: NATS decentralized authentication, so a new node's credentials
// are minted offline and a running server needs no change to accept them.
// The keys live in one directory (0700, files 0600); a cluster's members
// share a copy of it.
type Authority struct {
	dir         string
	operator    nkeys.KeyPair
	system      nkeys.KeyPair
	account     nkeys.KeyPair
	routeSecret string

	operatorJWT string
	systemJWT   string
	accountJWT  string
	// internal is the coordinator user of this process's own connections.
	internalJWT  string
	internalSeed []byte
}

// The files of an authority directory.
const (
	operatorFile = "operator.nk"
	systemFile   = "system.nk"
	accountFile  = "account.nk"
	routeFile    = "route.secret"
)

// AccountName is the name of the fabric's account.
const AccountName = "SHOAL"

// HasAuthority reports whether dir holds an authority's signing keys
// (OpenAuthority would make them otherwise).
func HasAuthority(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, accountFile))
	return err == nil
}

// OpenAuthority loads the keys in dir, creating any that are missing.
func OpenAuthority(dir string) (*Authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth dir: %w", err)
	}
	if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("auth dir %s is open to others and cannot be restricted: %w", dir, err)
		}
	}
	a := &Authority{dir: dir}
	var err error
	if a.operator, err = loadKey(dir, operatorFile, nkeys.CreateOperator); err != nil {
		return nil, err
	}
	if a.system, err = loadKey(dir, systemFile, nkeys.CreateAccount); err != nil {
		return nil, err
	}
	if a.account, err = loadKey(dir, accountFile, nkeys.CreateAccount); err != nil {
		return nil, err
	}
	secret, err := loadOrCreate(filepath.Join(dir, routeFile), func() ([]byte, error) {
		return []byte(randomSecret()), nil
	})
	if err != nil {
		return nil, err
	}
	a.routeSecret = strings.TrimSpace(string(secret))
	if err := a.encodeAccounts(); err != nil {
		return nil, err
	}
	if a.internalJWT, a.internalSeed, err = a.mint(RoleCoordinator, "shoal-internal", 0); err != nil {
		return nil, err
	}
	return a, nil
}

// loadKey reads a seed from dir/name, creating the key when the file does
// not exist.
func loadKey(dir, name string, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, error) {
	path := filepath.Join(dir, name)
	seed, err := loadOrCreate(path, func() ([]byte, error) {
		kp, err := create()
		if err != nil {
			return nil, err
		}
		return kp.Seed()
	})
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return nil, fmt.Errorf("auth key %s is not an nkey seed: %w", path, err)
	}
	return kp, nil
}

// loadOrCreate reads path, or writes what create makes to it (0600,
// without replacing a file another process wrote first).
func loadOrCreate(path string, create func() ([]byte, error)) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	b, err = create()
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return b, f.Close()
}

func (a *Authority) encodeAccounts() error {
	opPub, _ := a.operator.PublicKey()
	sysPub, _ := a.system.PublicKey()
	accPub, _ := a.account.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "shoal"
	oc.SystemAccount = sysPub
	var err error
	if a.operatorJWT, err = oc.Encode(a.operator); err != nil {
		return fmt.Errorf("sign the operator: %w", err)
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	if a.systemJWT, err = sc.Encode(a.operator); err != nil {
		return fmt.Errorf("sign the system account: %w", err)
	}
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = AccountName
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{
		MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit,
		Consumer: jwt.NoLimit, MaxAckPending: jwt.NoLimit,
	}
	if a.accountJWT, err = ac.Encode(a.operator); err != nil {
		return fmt.Errorf("sign the %s account: %w", AccountName, err)
	}
	return nil
}

// Dir is where the authority keeps its keys.
func (a *Authority) Dir() string { return a.dir }

// Issue mints a credentials file (the NATS .creds format) for name in
// role. A ttl above zero makes it expire.
func (a *Authority) Issue(role Role, name string, ttl time.Duration) ([]byte, error) {
	if _, err := ParseRole(string(role)); err != nil {
		return nil, err
	}
	if err := schemas.ValidID(name); err != nil {
		return nil, fmt.Errorf("credential name: %w", err)
	}
	if role == RoleNode {
		if err := schemas.ValidNodeName(name); err != nil {
			return nil, fmt.Errorf("credential name: %w", err)
		}
	}
	if ttl < 0 {
		return nil, fmt.Errorf("expiry %s is negative", ttl)
	}
	token, seed, err := a.mint(role, name, ttl)
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, seed)
}

func (a *Authority) mint(role Role, name string, ttl time.Duration) (string, []byte, error) {
	user, err := nkeys.CreateUser()
	if err != nil {
		return "", nil, err
	}
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	uc.Tags.Add(roleTag + string(role))
	uc.Permissions = permissions(role, name)
	if ttl > 0 {
		uc.Expires = time.Now().Add(ttl).Unix()
	}
	account := a.account
	if role == RoleSystem {
		account = a.system
	}
	token, err := uc.Encode(account)
	if err != nil {
		return "", nil, fmt.Errorf("sign credentials for %s %s: %w", role, name, err)
	}
	return token, seed, nil
}

const roleTag = "shoal-role:"

// routeUser is the user cluster members authenticate their routes as.
const routeUser = "shoal-route"

// apply puts the server into operator mode with the authority's accounts.
func (a *Authority) apply(opts *server.Options) error {
	oc, err := jwt.DecodeOperatorClaims(a.operatorJWT)
	if err != nil {
		return err
	}
	sysPub, _ := a.system.PublicKey()
	accPub, _ := a.account.PublicKey()
	r := &server.MemAccResolver{}
	r.Store(sysPub, a.systemJWT)
	r.Store(accPub, a.accountJWT)
	opts.TrustedOperators = []*jwt.OperatorClaims{oc}
	opts.SystemAccount = sysPub
	opts.AccountResolver = r
	return nil
}

// internal is the option that authenticates this process's own
// connections as the coordinator.
func (a *Authority) internal() nats.Option {
	return nats.UserJWTAndSeed(a.internalJWT, string(a.internalSeed))
}

// ServerConfig is a nats-server configuration block that trusts the
// authority, for a NATS deployment Shoal does not embed (`shoal up
// --nats`): the operator, the system account and a memory resolver
// preloaded with both accounts.
func (a *Authority) ServerConfig() string {
	sysPub, _ := a.system.PublicKey()
	accPub, _ := a.account.PublicKey()
	return fmt.Sprintf(`# Shoal's accounts, from %s. Add this to the configuration of every
# NATS server of the deployment; jetstream must be enabled.
# A client whose link goes silent is closed within three pings, before the
# stream's duplicate window (30s by default) passes: bytes it sent late
# are then never read, and never stored twice. Keep ping_interval at a
# sixth of the window if you change it (shoal up --stream-duplicates).
ping_interval: "5s"
ping_max: 2
operator: %s
system_account: %s
resolver: MEMORY
resolver_preload: {
  # SYS
  %s: %s
  # %s
  %s: %s
}
`, a.dir, a.operatorJWT, sysPub, sysPub, a.systemJWT, AccountName, accPub, a.accountJWT)
}

// Credentials says what a credentials file is for.
type Credentials struct {
	Role    Role
	Name    string
	Expires time.Time // zero when it never expires
}

// InboxPrefix is the reply namespace a connection with these credentials
// must use (nats.CustomInboxPrefix).
func (c Credentials) InboxPrefix() string { return schemas.InboxPrefix(string(c.Role), c.Name) }

// ReadCredentials reads a .creds file Shoal issued.
func ReadCredentials(path string) (Credentials, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("credentials: %w", err)
	}
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return Credentials{}, fmt.Errorf("credentials %s: %w", path, err)
	}
	if _, err := jwt.ParseDecoratedUserNKey(b); err != nil {
		return Credentials{}, fmt.Errorf("credentials %s hold no user key: %w", path, err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return Credentials{}, fmt.Errorf("credentials %s are not a NATS user: %w", path, err)
	}
	c := Credentials{Name: uc.Name}
	for _, t := range uc.Tags {
		if r, ok := strings.CutPrefix(t, roleTag); ok {
			c.Role = Role(r)
		}
	}
	if _, err := ParseRole(string(c.Role)); err != nil {
		return Credentials{}, fmt.Errorf("credentials %s were not issued by shoal (no role)", path)
	}
	if uc.Expires > 0 {
		c.Expires = time.Unix(uc.Expires, 0)
		if time.Now().After(c.Expires) {
			return Credentials{}, fmt.Errorf("credentials %s expired at %s; issue new ones with `shoal creds`", path, c.Expires.Format(time.RFC3339))
		}
	}
	return c, nil
}
