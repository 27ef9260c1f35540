package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/shoalfabric/shoal/schemas"
)

// JetStream keeps each account's streams under a directory of the store
// named after the account: "$G" for a server without accounts, the
// account's public key in operator mode (--auth). So a store written
// without --auth and served with it, or served with new keys (a new
// --auth-dir, as withdrawing a leaked credential takes), would be served
// from an empty account: its history there on disk, and nothing said.

// globalAccount is the account of a server without --auth.
const globalAccount = "$G"

// servedAccount is the account whose directory the server will keep the
// fabric's streams in.
func (c Config) servedAccount() string {
	if c.Auth == nil {
		return globalAccount
	}
	pub, err := c.Auth.account.PublicKey()
	if err != nil {
		return ""
	}
	return pub
}

// fabricAccounts are the accounts under the store's JetStream directory
// that hold the fabric's events (the stream AGENTS), by name.
func fabricAccounts(store string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(store, "jetstream"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read store %s: %w", store, unwrapPath(err))
	}
	var out []string
	for _, e := range entries {
		// Followed, not read as the entry: an account's directory may be
		// a link to another disk, and JetStream serves through it.
		if fi, err := os.Stat(filepath.Join(store, "jetstream", e.Name())); err != nil || !fi.IsDir() || e.Name() == "$SYS" {
			continue
		}
		if _, err := os.Stat(filepath.Join(store, "jetstream", e.Name(), "streams", schemas.StreamName)); err == nil {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out, nil
}

// adoptStore makes the fabric the store holds the one this server serves,
// before the server opens the store: when the served account has none
// and exactly one other account has, that account's directory (its
// stream, buckets and object store, with their consumers) becomes the
// served account's, and what was done is returned to be said. A store
// holding the fabric under several other accounts is refused, naming
// them; so is moving one in a cluster, whose members agree on where each
// stream lives. Nothing is moved when the served account has its own.
func adoptStore(c Config) (said string, err error) {
	served := c.servedAccount()
	if served == "" {
		return "", errors.New("the authority's account has no public key")
	}
	held, err := fabricAccounts(c.StoreDir)
	if err != nil || len(held) == 0 {
		return "", err
	}
	if slices.Contains(held, served) {
		if others := slices.DeleteFunc(slices.Clone(held), func(a string) bool { return a == served }); len(others) > 0 {
			return fmt.Sprintf("store %s also holds a fabric's history under account %s, which this server does not serve (written without --auth, or with other keys); it is left as it is",
				c.StoreDir, strings.Join(others, ", ")), nil
		}
		return "", nil
	}
	js := filepath.Join(c.StoreDir, "jetstream")
	switch {
	case len(held) > 1:
		return "", schemas.Errf(schemas.CodeInvalid, "store %s holds a fabric's history under several accounts (%s) and none under the one this server serves (%s): start it with the keys (--auth-dir) or without --auth as the history was written, or move one of %s/<account> to %s/%s while no server runs",
			c.StoreDir, strings.Join(held, ", "), served, js, js, served)
	case c.Cluster.Name != "":
		return "", schemas.Errf(schemas.CodeInvalid, "store %s holds the fabric's history under account %s, not the one this server serves (%s), and a cluster member does not move it: start it with the keys (--auth-dir) or without --auth as the history was written",
			c.StoreDir, held[0], served)
	}
	from, to := filepath.Join(js, held[0]), filepath.Join(js, served)
	aside := ""
	if fi, err := os.Lstat(to); err == nil {
		if fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir() {
			return "", schemas.Errf(schemas.CodeInvalid, "store %s holds the fabric's history under account %s, and %s, where this server keeps its own, is not a directory of the store: move the history there yourself while no server runs",
				c.StoreDir, held[0], to)
		}
		// The served account's directory, without the fabric's stream:
		// set aside, not removed, and said.
		aside = to + ".set-aside-" + randomSecret()[:8]
		if err := os.Rename(to, aside); err != nil {
			return "", fmt.Errorf("set aside %s: %w", to, unwrapPath(err))
		}
	}
	if err := os.Rename(from, to); err != nil {
		return "", fmt.Errorf("take up the fabric's history from %s: %w", from, unwrapPath(err))
	}
	said = fmt.Sprintf("store %s held the fabric's history under account %s (written without --auth, or with other keys): it is now served from account %s, every event, record and bundle of it kept",
		c.StoreDir, held[0], served)
	if aside != "" {
		said += fmt.Sprintf("; what account %s held before, without the fabric's events, is set aside in %s", served, aside)
	}
	return said, nil
}
