package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// ReposBucket is the JetStream object store of repository bundles: what a
// caller ships to the node that runs an agent on its repository, and what
// a node ships back of the agent's work.
const ReposBucket = "shoal_repos"

// A Workspace is an agent's own checkout of a caller's repository (a
// Shoal addition): the agent starts on Commit, on branch Branch, in a
// directory of its node.
type Workspace struct {
	// Repo is the repository's identity: its first root commit, the same
	// in every clone.
	Repo string `json:"repo"`
	// Source is the caller's repository, as the caller named it; for
	// people to read, never opened by a node.
	Source string `json:"source,omitempty"`
	// Ref is what the caller named (HEAD by default); Base the commit it
	// named; Commit the one the agent starts on: Base, or, with
	// WithChanges, a commit of the caller's uncommitted work on top.
	Ref         string `json:"ref,omitempty"`
	Base        string `json:"base"`
	Commit      string `json:"commit"`
	WithChanges bool   `json:"with_changes,omitempty"`
	// Bundle names the object in ReposBucket holding what the node lacked
	// of Commit; empty when it had it all.
	Bundle string `json:"bundle,omitempty"`
	// Branch is the agent's branch in its checkout, and in the caller's
	// repository once fetched: BranchName(id).
	Branch string `json:"branch,omitempty"`
	// Resume is where the checkout begins when the agent moved from
	// another node: its work there (its commits, and a commit of what it
	// had not committed). Empty: at Commit.
	Resume string `json:"resume,omitempty"`
	// Dir is the agent's checkout on its node (NodeRecord.Checkouts/<id>):
	// set by the caller's client from the node's record, so that the
	// policy the coordinator's side claims the agent with names the
	// directory the agent will work in.
	Dir string `json:"dir,omitempty"`
}

// BundleName is the object in ReposBucket a bundle of commit for a reader
// holding haves is stored under: the same commit for the same haves is
// one bundle, whichever node reads it.
func BundleName(repo, commit string, haves []string) string {
	h := sha256.Sum256([]byte(strings.Join(slices.Sorted(slices.Values(haves)), "\n")))
	return repo + "/" + commit + "-" + hex.EncodeToString(h[:8]) + ".bundle"
}

// WorkBundlePrefix begins the name of every bundle of agent's work that
// node writes: a node writes under its own agents' prefixes only, never a
// name a caller's open reads (BundleName), which it could otherwise
// fill with anything first.
func WorkBundlePrefix(repo, node, agent string) string {
	return repo + "/work/" + node + "/" + agent + "/"
}

// WorkBundleName is the object a bundle of agent's work at commit, for a
// reader holding haves, is stored under by node.
func WorkBundleName(repo, node, agent, commit string, haves []string) string {
	return WorkBundlePrefix(repo, node, agent) + strings.TrimPrefix(BundleName("", commit, haves), "/")
}

// BranchName is the branch of agent id's work.
func BranchName(id string) string { return "shoal/" + id }

// ValidCommit reports why s is not a full commit id, or nil.
func ValidCommit(what, s string) error {
	if len(s) != 40 && len(s) != 64 {
		return fmt.Errorf("%s %.20q is not a full commit id (40 or 64 hexadecimal digits)", what, s)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%s %.20q is not a full commit id (40 or 64 hexadecimal digits)", what, s)
		}
	}
	return nil
}

// RepoHasRequest asks a node whether its cache holds a commit of a
// repository (shoal.node.<node>.repo_has).
type RepoHasRequest struct {
	Repo   string `json:"repo"`
	Commit string `json:"commit"`
}

// RepoHasReply says whether it does and, when not, the newest commits of
// the repository it holds, which a bundle for it may leave out.
type RepoHasReply struct {
	Has   bool     `json:"has"`
	Haves []string `json:"haves,omitempty"`
}

// DiffRequest asks for an agent's work against its start
// (shoal.node.<node>.diff): the diff, or with Stat a summary of it.
type DiffRequest struct {
	AgentID string `json:"agent_id"`
	Stat    bool   `json:"stat,omitempty"`
	// Excludes are what the caller's git ignores beyond the repository's
	// .gitignore files, as WorkRequest.Excludes: the diff leaves out what
	// a fetch would.
	Excludes string `json:"excludes,omitempty"`
}

// FetchRequest brings an agent's work into the caller's repository as
// branch shoal/<id> (agent_fetch); Into is a directory of that
// repository's work tree (the one the agent was opened on when empty).
type FetchRequest struct {
	AgentID string `json:"agent_id"`
	Into    string `json:"into,omitempty"`
	// Force moves the branch even past commits of the agent's that its
	// work no longer holds.
	Force bool `json:"force,omitempty"`
}

// FetchReply is what a fetch brought into the caller's repository.
type FetchReply struct {
	Branch  string `json:"branch"`  // shoal/<id>
	Tip     string `json:"tip"`     // its commit
	Base    string `json:"base"`    // the commit the agent started on
	Commits int    `json:"commits"` // how many commits came
	Files   int    `json:"files"`   // how many files its work changes
	Into    string `json:"into"`    // the repository the branch is in
}

// DiffReply is an agent's work as git diff prints it, against Base (the
// commit it started on: with the caller's uncommitted work, the commit of
// that), and how many files it changes.
type DiffReply struct {
	Diff  string `json:"diff"`
	Base  string `json:"base"`
	Files int    `json:"files"`
}

// WorkRequest asks a node for a bundle of an agent's work
// (shoal.node.<node>.work): its commits and, on top, a commit of its
// uncommitted work.
type WorkRequest struct {
	AgentID string `json:"agent_id"`
	// Haves are commits the bundle's reader holds, which it may leave
	// out; empty: the agent's base (what the caller has).
	Haves []string `json:"haves,omitempty"`
	// Whole asks for all the history up to the work, for a reader that
	// holds nothing of the repository.
	Whole bool `json:"whole,omitempty"`
	// Excludes are the patterns, in .gitignore's form, that the caller's
	// git ignores beyond the repository's .gitignore files (their global
	// excludes file and the repository's info/exclude), at most
	// MaxExcludesBytes: the commit of the agent's uncommitted work leaves
	// out what they match, as the caller's git status would.
	Excludes string `json:"excludes,omitempty"`
}

// MaxExcludesBytes bounds WorkRequest.Excludes.
const MaxExcludesBytes = 64 << 10

// WorkReply names the bundle in ReposBucket (empty when the agent's work
// is its start, which the caller has), its tip and the agent's branch.
type WorkReply struct {
	Bundle  string `json:"bundle,omitempty"`
	Tip     string `json:"tip"`
	Base    string `json:"base"`
	Branch  string `json:"branch"`
	Commits int    `json:"commits"`
	Files   int    `json:"files"`
}
