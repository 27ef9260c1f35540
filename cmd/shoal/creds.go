package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shoalfabric/shoal/broker"
	"github.com/shoalfabric/shoal/schemas"
)

func credsCommand() *command {
	return &command{
		name:    "creds",
		args:    "ROLE NAME | server-config",
		summary: "issue credentials for a node, a client, an observer or monitoring",
		help: `
Issues NATS credentials (a .creds file) signed by this coordinator's keys,
for a coordinator started with --auth. Run it on the coordinator's machine;
the keys are made on first use.

Roles:
  node NAME         an agent host: answers only its own control subjects
                    and publishes only for agents it owns (shoal node
                    --creds FILE; the node takes its name from them)
  client NAME       drives agents through the coordinator: the command
                    line, shoal mcp, the TUI
  observer NAME     watches and replays agents, reads their status and
                    output; cannot open, send, interrupt or close
  coordinator NAME  every right in the fabric: for shoal up --nats against
                    a NATS deployment Shoal does not run
  system NAME       a user of the NATS system account, for monitoring the
                    servers (nats server info|list|report, surveyors):
                    their monitoring requests only, nothing in the fabric

shoal creds server-config prints the nats-server configuration block that
makes such a deployment trust these keys.

Credentials are secrets: keep the file 0600 and move it to its machine
over a channel you trust.`,
		flags: func(fs *flag.FlagSet) runner {
			var out, authDir string
			var expires time.Duration
			var force bool
			fs.StringVar(&out, "out", "", "write the credentials to this `file` (0600) instead of standard output")
			fs.BoolVar(&force, "force", false, "replace --out if it exists")
			durationFlag(fs, &expires, "expires", 0, "make the credentials expire after this `duration` (0: never)")
			fs.StringVar(&authDir, "auth-dir", "", "`directory` of the signing keys (default: $XDG_DATA_HOME/shoal/auth, as shoal up --auth)")
			return func(ctx context.Context, env *environment, args []string) error {
				if authDir == "" {
					authDir = filepath.Join(dataHome(env.getenv), "shoal", "auth")
				}
				// Keys made here sign credentials only a coordinator with
				// the same keys accepts: say so, rather than issue them
				// silently for a coordinator started with others.
				if !broker.HasAuthority(authDir) {
					defer func() {
						if broker.HasAuthority(authDir) {
							fmt.Fprintf(env.io.err, "shoal: there were no signing keys in %s: made new ones; only a coordinator using them (shoal up --auth --auth-dir %s) accepts what they sign\n", authDir, authDir)
						}
					}()
				}
				if len(args) == 1 && args[0] == "server-config" {
					auth, err := broker.OpenAuthority(authDir)
					if err != nil {
						return err
					}
					_, err = fmt.Fprint(env.io.out, auth.ServerConfig())
					return err
				}
				if len(args) != 2 {
					return usagef("want a role and a name, e.g. shoal creds node mac-studio (or shoal creds server-config)")
				}
				role, err := broker.ParseRole(args[0])
				if err != nil {
					return usagef("%v", err)
				}
				if expires < 0 {
					return usagef("--expires %s is negative", expires)
				}
				// Checked before the keys are opened, which makes them
				// when there are none: a mistyped name makes nothing.
				valid := schemas.ValidID
				if role == broker.RoleNode {
					valid = schemas.ValidNodeName
				}
				if err := valid(args[1]); err != nil {
					return usagef("credential name: %v", err)
				}
				auth, err := broker.OpenAuthority(authDir)
				if err != nil {
					return err
				}
				creds, err := auth.Issue(role, args[1], expires)
				if err != nil {
					return usagef("%v", err)
				}
				if out == "" {
					_, err := env.io.out.Write(creds)
					return err
				}
				flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
				if force {
					flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
				}
				f, err := os.OpenFile(out, flags, 0o600)
				if errors.Is(err, os.ErrExist) {
					return usagef("%s exists; give --force to replace it", out)
				}
				if err != nil {
					return err
				}
				if _, err := f.Write(creds); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
				fmt.Fprintf(env.io.err, "shoal: wrote %s credentials for %s to %s\n", role, args[1], out)
				return nil
			}
		},
	}
}
