package schemas

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// BudgetsBucket is the KV bucket of budgets and of what was spent against
// them: an agent's id to the Budget its turns may use (set at its open,
// changed with shoal budget set); FleetBudgetKey and LabelBudgetKey to
// what every agent of the fleet, or of the nodes that carry a label, may
// use; SpentKey to the coordinator's count of what the turns used
// (Spent). The coordinator's side writes it; a node reads it when it
// starts a turn.
const BudgetsBucket = "shoal_budgets"

// Keys of BudgetsBucket beside the agents' own: none is an agent id (an id
// starts with a letter or a digit).
const (
	// FleetBudgetKey holds the fleet's Budget.
	FleetBudgetKey = "_fleet"
	// SpentKey holds the coordinator's Spent.
	SpentKey = "_spent"
	// labelBudgetPrefix, with the label encoded, holds a label's Budget.
	labelBudgetPrefix = "_label."
)

// LabelBudgetKey is the key of the budget of label ("key=value": every
// node that carries it).
func LabelBudgetKey(label string) string {
	return labelBudgetPrefix + base64.RawURLEncoding.EncodeToString([]byte(label))
}

// LabelOfBudgetKey is the label whose budget key holds, if it holds one.
func LabelOfBudgetKey(key string) (string, bool) {
	enc, ok := strings.CutPrefix(key, labelBudgetPrefix)
	if !ok {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	return string(b), err == nil
}

// Label is a node's label as budgets and usage name it: "key=value".
func Label(key, value string) string { return key + "=" + value }

// LabelsOf are a node's labels as budgets name them, sorted.
func LabelsOf(labels map[string]string) []string {
	out := make([]string, 0, len(labels))
	for k, v := range labels {
		out = append(out, Label(k, v))
	}
	sort.Strings(out)
	return out
}

// ValidLabel checks a label as a budget names it: key=value, the key not
// empty.
func ValidLabel(label string) error {
	k, _, ok := strings.Cut(label, "=")
	if !ok || strings.TrimSpace(k) == "" {
		return Errf(CodeInvalid, "label %q is not key=value", label)
	}
	return nil
}

// Budget is what turns may use, in all: tokens (input, output and cache,
// as the turns report them) and cost in dollars (where the CLI reports
// one). Zero is no limit.
type Budget struct {
	Tokens int64   `json:"tokens,omitempty"`
	USD    float64 `json:"usd,omitempty"`
	// GrantedBy is the agent whose budget this one was taken out of, when
	// that agent's open of its child gave it; empty for a budget a person
	// set, which an agent's open never raises.
	GrantedBy string `json:"granted_by,omitempty"`
}

// IsZero reports whether b limits nothing.
func (b Budget) IsZero() bool { return b.Tokens <= 0 && b.USD <= 0 }

// String is the budget as a person reads it.
func (b Budget) String() string {
	var parts []string
	if b.Tokens > 0 {
		parts = append(parts, fmt.Sprintf("%d tokens", b.Tokens))
	}
	if b.USD > 0 {
		parts = append(parts, fmt.Sprintf("$%.4f", b.USD))
	}
	if len(parts) == 0 {
		return "no limit"
	}
	return strings.Join(parts, ", ")
}

// Within is b limited to what limit limits: in each of tokens and
// dollars that limit has, b's is no larger, and set.
func (b Budget) Within(limit Budget) Budget {
	if limit.Tokens > 0 && (b.Tokens <= 0 || b.Tokens > limit.Tokens) {
		b.Tokens = limit.Tokens
	}
	if limit.USD > 0 && (b.USD <= 0 || b.USD > limit.USD) {
		b.USD = limit.USD
	}
	return b
}

// Grants reports whether b, with used used of it, may give want away (to
// an agent's child): want is set, and less than what is left of b, in
// each of tokens and dollars b limits.
func (b Budget) Grants(want Budget, used Usage) bool {
	if b.Tokens > 0 && (want.Tokens <= 0 || want.Tokens >= b.Tokens-TokensOf(used)) {
		return false
	}
	if b.USD > 0 {
		cost := 0.0
		if used.CostUSD != nil {
			cost = *used.CostUSD
		}
		if want.USD <= 0 || want.USD >= b.USD-cost {
			return false
		}
	}
	return true
}

// Left is what is left of b in each of tokens and dollars it limits once
// u is used, at least the smallest amount that still limits (a budget of
// 0 limits nothing): a budget used up leaves one token, or a hundredth of
// a cent, which a turn then passes at once.
func (b Budget) Left(u Usage) Budget {
	l := Budget{GrantedBy: b.GrantedBy}
	if b.Tokens > 0 {
		l.Tokens = max(b.Tokens-TokensOf(u), 1)
	}
	if b.USD > 0 {
		l.USD = b.USD
		if u.CostUSD != nil {
			l.USD = max(b.USD-*u.CostUSD, 0.0001)
		}
	}
	return l
}

// After is b on top of what u used: a budget over every life of an agent
// that lets the next one spend b.
func (b Budget) After(u Usage) Budget {
	if b.Tokens > 0 {
		b.Tokens += TokensOf(u)
	}
	if b.USD > 0 && u.CostUSD != nil {
		b.USD += *u.CostUSD
	}
	return b
}

// Less is b with what of it was given away taken out, in each of tokens
// and dollars b limits.
func (b Budget) Less(given Budget) Budget {
	if b.Tokens > 0 {
		b.Tokens -= given.Tokens
	}
	if b.USD > 0 {
		b.USD -= given.USD
	}
	return b
}

// More is b with given put back, in each of tokens and dollars b limits.
func (b Budget) More(given Budget) Budget {
	if b.Tokens > 0 {
		b.Tokens += given.Tokens
	}
	if b.USD > 0 {
		b.USD += given.USD
	}
	return b
}

// TokensOf are the tokens a usage counts against a budget.
func TokensOf(u Usage) int64 {
	return addTokens(addTokens(u.InputTokens, u.OutputTokens), addTokens(u.CacheReadTokens, u.CacheCreationTokens))
}

// Scope is what a budget covers: one agent, the fleet, or the agents of
// the nodes that carry a label.
type Scope struct {
	Agent string // an agent's id
	Fleet bool
	Label string // "key=value"
}

// String names the scope as a refusal does.
func (s Scope) String() string {
	switch {
	case s.Fleet:
		return "the fleet"
	case s.Label != "":
		return "label " + s.Label
	}
	return "agent " + s.Agent
}

// setCommand is how a person raises the scope's budget.
func (s Scope) setCommand() string {
	switch {
	case s.Fleet:
		return "shoal budget set --fleet"
	case s.Label != "":
		return "shoal budget set --label " + s.Label
	}
	return "shoal budget set " + s.Agent
}

// Over says why turns under scope may not go on with usage u used under
// budget b, naming the budget, what was used and how to raise it (code
// unavailable); nil when they may.
func (b Budget) Over(s Scope, u Usage) error {
	if used := TokensOf(u); b.Tokens > 0 && used >= b.Tokens {
		return Errf(CodeUnavailable, "%s has used %d tokens of its budget of %d: raise it with %s --tokens N", s, used, b.Tokens, s.setCommand())
	}
	if b.USD > 0 && u.CostUSD != nil && *u.CostUSD >= b.USD {
		return Errf(CodeUnavailable, "%s has spent $%.4f of its budget of $%.4f: raise it with %s --usd X", s, *u.CostUSD, b.USD, s.setCommand())
	}
	return nil
}

// Allowance is what a turn of an agent is held to when it starts: the
// agent's own budget, and the budgets of the fleet and of its node's
// labels, each with what its agents have spent so far as the coordinator
// counted it (Spent). The agent's own use is its record's.
type Allowance struct {
	Agent  Budget        `json:"agent"`
	Shared []SharedLimit `json:"shared,omitempty"`
	// Counted is what the count holds of the turns this life of the
	// asking node ran: the node adds to the shared budgets' use what it
	// ran beyond it, the turns the coordinator has not counted yet.
	Counted Usage `json:"counted"`
}

// Unseen is what a node whose turns in this life used produced has used
// beyond what the count holds (counted), field by field, never below
// zero.
func Unseen(produced, counted Usage) Usage {
	d := func(a, b int64) int64 { return max(a-b, 0) }
	u := Usage{InputTokens: d(produced.InputTokens, counted.InputTokens), OutputTokens: d(produced.OutputTokens, counted.OutputTokens),
		CacheReadTokens: d(produced.CacheReadTokens, counted.CacheReadTokens), CacheCreationTokens: d(produced.CacheCreationTokens, counted.CacheCreationTokens)}
	if produced.CostUSD != nil {
		c := *produced.CostUSD
		if counted.CostUSD != nil {
			c = max(c-*counted.CostUSD, 0)
		}
		u.CostUSD = &c
	}
	return u
}

// WithUnseen is a with unseen added to what each shared budget's agents
// used.
func (a Allowance) WithUnseen(unseen Usage) Allowance {
	out := a
	out.Shared = make([]SharedLimit, len(a.Shared))
	for i, l := range a.Shared {
		l.Used.Add(unseen)
		out.Shared[i] = l
	}
	return out
}

// SharedLimit is a budget many agents draw on, with what they have used.
type SharedLimit struct {
	Fleet  bool   `json:"fleet,omitempty"`
	Label  string `json:"label,omitempty"`
	Budget Budget `json:"budget"`
	Used   Usage  `json:"used"`
}

// Scope is what the limit covers.
func (l SharedLimit) Scope() Scope { return Scope{Fleet: l.Fleet, Label: l.Label} }

// Check says why a turn of agent id, whose own turns used own, may not go
// on having used running in the turn so far (zero before it starts); nil
// when it may. The agent's budget comes first, then the fleet's, then
// the labels'.
func (a Allowance) Check(id string, own, running Usage) error {
	mine := own
	mine.Add(running)
	if err := a.Agent.Over(Scope{Agent: id}, mine); err != nil {
		return err
	}
	for _, l := range a.Shared {
		used := l.Used
		used.Add(running)
		if err := l.Budget.Over(l.Scope(), used); err != nil {
			return err
		}
	}
	return nil
}

// Limits reports whether the allowance limits anything.
func (a Allowance) Limits() bool { return !a.Agent.IsZero() || len(a.Shared) > 0 }

// AllowanceOf is agent id's allowance on node (in its life instance)
// carrying labels, from the values of BudgetsBucket that get reads (found
// false for a key not there).
func AllowanceOf(id, node, instance string, labels []string, get func(key string) (value []byte, found bool, err error)) (Allowance, error) {
	var a Allowance
	read := func(key string, v any) (bool, error) {
		b, found, err := get(key)
		if err != nil || !found {
			return false, err
		}
		if err := json.Unmarshal(b, v); err != nil {
			return false, Errf(CodeInternal, "%s in %s does not decode: %v", key, BudgetsBucket, err)
		}
		return true, nil
	}
	if _, err := read(id, &a.Agent); err != nil {
		return a, err
	}
	var shared []SharedLimit
	var fleet Budget
	if ok, err := read(FleetBudgetKey, &fleet); err != nil {
		return a, err
	} else if ok && !fleet.IsZero() {
		shared = append(shared, SharedLimit{Fleet: true, Budget: fleet})
	}
	for _, l := range labels {
		var b Budget
		if ok, err := read(LabelBudgetKey(l), &b); err != nil {
			return a, err
		} else if ok && !b.IsZero() {
			shared = append(shared, SharedLimit{Label: l, Budget: b})
		}
	}
	if len(shared) == 0 {
		return a, nil
	}
	var spent Spent
	if _, err := read(SpentKey, &spent); err != nil {
		return a, err
	}
	for i := range shared {
		if shared[i].Fleet {
			shared[i].Used = spent.Fleet()
		} else {
			shared[i].Used = spent.Label(shared[i].Label)
		}
	}
	a.Shared = shared
	a.Counted = spent.Counted(node, instance)
	return a, nil
}

// Spent is what the fleet's turns have used, as the coordinator counts it
// from the result events of the AGENTS stream (every one once: Seq is the
// last stream sequence counted, and the count and Seq are written
// together). A row is what the turns one node ran, while it carried the
// same labels, for agents of one model used; the rows of a node's current
// life (its Instance) stand apart, so the node can tell which of its
// turns the count holds.
type Spent struct {
	Seq  uint64     `json:"seq"`
	Rows []SpentRow `json:"rows,omitempty"`
}

// SpentRow is one row of Spent.
type SpentRow struct {
	Node     string   `json:"node"`
	Instance string   `json:"instance,omitempty"` // the node's life, while it is the current one
	Model    string   `json:"model"`
	Labels   []string `json:"labels,omitempty"` // the node's, sorted (LabelsOf)
	Turns    int64    `json:"turns"`
	Usage    Usage    `json:"usage"`
}

// Add counts one turn that used u, of an agent of model, on node in its
// life instance while it carried labels (sorted).
func (s *Spent) Add(node, instance, model string, labels []string, u Usage) {
	s.add(SpentRow{Node: node, Instance: instance, Model: model, Labels: slices.Clone(labels), Turns: 1, Usage: u})
}

// AddMore counts u as more of a turn counted before (no turn more).
func (s *Spent) AddMore(node, instance, model string, labels []string, u Usage) {
	s.add(SpentRow{Node: node, Instance: instance, Model: model, Labels: slices.Clone(labels), Usage: u})
}

// CloserName is what the coordinator's events carry as their producer:
// its node-loss monitor's, which closes the turns of agents whose node
// was lost.
const CloserName = "coordinator"

// TurnResults reads the result events of agents' streams in order, for
// their sum: a turn the coordinator closed for a lost node (a cancelled
// result with the use the node last recorded) may have its own result
// stored after, from a node that was only away (a partition, a process
// stopped past its heartbeat); only what that result used beyond the
// cancelled one's is more. The zero value is ready to use.
type TurnResults struct {
	closed map[string]closedTurn
}

type closedTurn struct {
	turn int
	used Usage
}

// Take reads agent's result of turn, from node, that used u, and returns
// what of it to count, and whether it is more of a turn counted before.
func (t *TurnResults) Take(agent, node string, turn int, u *Usage) (count *Usage, more bool) {
	c, closed := t.closed[agent]
	switch {
	case node == CloserName:
		if t.closed == nil {
			t.closed = map[string]closedTurn{}
		}
		var used Usage
		if u != nil {
			used = *u
		}
		t.closed[agent] = closedTurn{turn: turn, used: used}
		return u, false
	case !closed:
		return u, false
	}
	delete(t.closed, agent)
	if turn != c.turn || u == nil {
		return u, false
	}
	beyond := Unseen(*u, c.used)
	return &beyond, true
}

// RanOn is the node a result's turn ran on, from its event's producer
// (HeaderNode) and, for the coordinator's closing of a lost node's agent,
// the node it names (HeaderClosedFor).
func RanOn(producer, closedFor string) string {
	if producer == CloserName && closedFor != "" {
		return closedFor
	}
	return producer
}

// MaxSpentRowsPerNode bounds the rows one node's turns make in Spent (its
// lives, models and label sets): past it, a turn that would make a new
// row is counted in the node's row of model OtherModel, no life and no
// labels, still the fleet's. Its labels' budgets then do not see it, nor
// does the node among its life's counted turns (it counts them again as
// unseen, over rather than under). A node makes at most
// MaxSpentRowsPerNode+1 rows, each of at most MaxNodeLabels labels.
const MaxSpentRowsPerNode = 32

// OtherModel is the model of a node's row of the turns past
// MaxSpentRowsPerNode.
const OtherModel = "other"

func (s *Spent) add(row SpentRow) {
	same := func(r SpentRow) bool {
		return r.Node == row.Node && r.Instance == row.Instance && r.Model == row.Model && slices.Equal(r.Labels, row.Labels)
	}
	i := slices.IndexFunc(s.Rows, same)
	if i < 0 && s.rowsOf(row.Node) >= MaxSpentRowsPerNode {
		row.Instance, row.Model, row.Labels = "", OtherModel, nil
		i = slices.IndexFunc(s.Rows, same)
	}
	if i < 0 {
		s.Rows = append(s.Rows, SpentRow{Node: row.Node, Instance: row.Instance, Model: row.Model, Labels: row.Labels})
		i = len(s.Rows) - 1
	}
	s.Rows[i].Turns = addTokens(s.Rows[i].Turns, row.Turns)
	s.Rows[i].Usage.Add(row.Usage)
}

// rowsOf counts node's rows, but for its row past the bound.
func (s *Spent) rowsOf(node string) int {
	n := 0
	for _, r := range s.Rows {
		if r.Node == node && !(r.Instance == "" && r.Model == OtherModel && len(r.Labels) == 0) {
			n++
		}
	}
	return n
}

// Retire folds the rows of node's lives other than current into rows of
// no life: only the current life's stand apart.
func (s *Spent) Retire(node, current string) {
	var keep, old []SpentRow
	for _, r := range s.Rows {
		if r.Node == node && r.Instance != "" && r.Instance != current {
			old = append(old, r)
		} else {
			keep = append(keep, r)
		}
	}
	if len(old) == 0 {
		return
	}
	s.Rows = keep
	for _, r := range old {
		r.Instance = ""
		s.add(r)
	}
}

// Counted is what the count holds of the turns node ran in its life
// instance.
func (s Spent) Counted(node, instance string) Usage {
	var u Usage
	for _, r := range s.Rows {
		if r.Node == node && r.Instance == instance && instance != "" {
			u.Add(r.Usage)
		}
	}
	return u
}

// Fleet is what every turn used.
func (s Spent) Fleet() Usage {
	var u Usage
	for _, r := range s.Rows {
		u.Add(r.Usage)
	}
	return u
}

// Label is what the turns of nodes carrying label used.
func (s Spent) Label(label string) Usage {
	var u Usage
	for _, r := range s.Rows {
		if slices.Contains(r.Labels, label) {
			u.Add(r.Usage)
		}
	}
	return u
}

// BudgetRequest sets a budget (shoal budget set): an agent's, the
// fleet's, or that of the nodes that carry a label; exactly one of the
// three is named. A zero Tokens or USD lifts that limit.
type BudgetRequest struct {
	AgentID string  `json:"agent_id,omitempty"`
	Fleet   bool    `json:"fleet,omitempty"`
	Label   string  `json:"label,omitempty"`
	Tokens  int64   `json:"tokens,omitempty"`
	USD     float64 `json:"usd,omitempty"`
	// KeepTokens and KeepUSD keep that limit as it is stored, whatever
	// Tokens or USD say: a request that sets one limit leaves the other,
	// read and written in one step (a child's draw on the budget in
	// between is not undone).
	KeepTokens bool `json:"keep_tokens,omitempty"`
	KeepUSD    bool `json:"keep_usd,omitempty"`
}

// Scope is what the request names, or why it names no one thing.
func (r BudgetRequest) Scope() (Scope, error) {
	named := 0
	for _, b := range []bool{r.AgentID != "", r.Fleet, r.Label != ""} {
		if b {
			named++
		}
	}
	if named != 1 {
		return Scope{}, Errf(CodeInvalid, "a budget is of one agent, the fleet or a label: name exactly one (agent_id, fleet or label)")
	}
	if r.AgentID != "" {
		if err := ValidID(r.AgentID); err != nil {
			return Scope{}, Errf(CodeInvalid, "agent %v", err)
		}
	}
	if r.Label != "" {
		if err := ValidLabel(r.Label); err != nil {
			return Scope{}, err
		}
	}
	if err := CheckBudget(r.Tokens, r.USD); err != nil {
		return Scope{}, err
	}
	return Scope{Agent: r.AgentID, Fleet: r.Fleet, Label: r.Label}, nil
}

// CheckBudget says why tokens and usd are no budget, or returns nil: each
// is 0 (no limit) or more, and a number of dollars is finite (NaN passes
// every comparison, and no JSON holds it).
func CheckBudget(tokens int64, usd float64) error {
	switch {
	case tokens < 0:
		return Errf(CodeInvalid, "a budget is 0 (no limit) or more tokens and a finite number of dollars, not %d tokens", tokens)
	case !(usd >= 0) || math.IsInf(usd, 1):
		return Errf(CodeInvalid, "a budget is 0 (no limit) or more tokens and a finite number of dollars, not %g dollars", usd)
	}
	return nil
}

// Agent is the agent the request is about, for the rights rules.
func (r BudgetRequest) Agent() string { return r.AgentID }

// Key is the BudgetsBucket key of the scope's budget.
func (s Scope) Key() string {
	switch {
	case s.Fleet:
		return FleetBudgetKey
	case s.Label != "":
		return LabelBudgetKey(s.Label)
	}
	return s.Agent
}

// BudgetsReply is every budget with what was used against it, and the
// coordinator's count of what the fleet's turns used.
type BudgetsReply struct {
	Budgets []BudgetLine `json:"budgets"`
	Spent   Spent        `json:"spent"`
	// Next, in a page, is the key of the budget the next page starts
	// after.
	Next string `json:"next,omitempty"`
}

// BudgetsRequest reads the budgets through the fabric service: whole (a
// client of an earlier version asks with nothing), or Paged, the page of
// budgets whose keys sort after After; the first page carries Spent.
type BudgetsRequest struct {
	Paged bool   `json:"paged,omitempty"`
	After string `json:"after,omitempty"`
}

// BudgetsPage is the page of all's budgets whose keys sort after after,
// within maxBytes encoded (one budget at least), in key order; the first
// page (after empty) carries all's Spent.
func BudgetsPage(all BudgetsReply, after string, maxBytes int) BudgetsReply {
	lines := slices.Clone(all.Budgets)
	slices.SortFunc(lines, func(a, b BudgetLine) int { return strings.Compare(a.Scope().Key(), b.Scope().Key()) })
	rep := BudgetsReply{Budgets: []BudgetLine{}}
	size := 64
	if after == "" {
		rep.Spent = all.Spent
		b, _ := json.Marshal(all.Spent)
		size += len(b)
	}
	for _, l := range lines {
		key := l.Scope().Key()
		if after != "" && key <= after {
			continue
		}
		b, _ := json.Marshal(l)
		if len(rep.Budgets) > 0 && size+len(b)+1 > maxBytes {
			rep.Next = rep.Budgets[len(rep.Budgets)-1].Scope().Key()
			break
		}
		size += len(b) + 1
		rep.Budgets = append(rep.Budgets, l)
	}
	return rep
}

// BudgetLine is one budget and what its agents used: an agent's as its
// record says, the fleet's and a label's as Spent counts.
type BudgetLine struct {
	AgentID string `json:"agent_id,omitempty"`
	Fleet   bool   `json:"fleet,omitempty"`
	Label   string `json:"label,omitempty"`
	Budget  Budget `json:"budget"`
	Used    Usage  `json:"used"`
}

// Scope is what the line's budget covers.
func (l BudgetLine) Scope() Scope { return Scope{Agent: l.AgentID, Fleet: l.Fleet, Label: l.Label} }
