package schemas

// JobsBucket is the KV bucket of jobs (shoal job, agent_job): a job's id,
// which is its agent's, to its JobRecord, written by whoever runs the job.
const JobsBucket = "shoal_jobs"

// JobStatus is where a job stands.
type JobStatus string

// The job statuses.
const (
	// JobRunning: its runner opens the agent, runs its turns or fetches
	// its work.
	JobRunning JobStatus = "running"
	// JobSucceeded: every turn ended well and the work was fetched.
	JobSucceeded JobStatus = "succeeded"
	// JobFailed: a turn failed, or the agent could not be opened or its
	// work fetched; Error says why.
	JobFailed JobStatus = "failed"
	// JobLost: the record says running, but its runner has not said a
	// word for JobLostAfter (it was killed, or its machine went away).
	// Never stored: readers judge it.
	JobLost JobStatus = "lost"
)

// JobBeatSeconds is how often a running job's runner writes its record;
// JobLostAfterSeconds how long a silent one is taken to be lost.
const (
	JobBeatSeconds      = 10
	JobLostAfterSeconds = 45
)

// JobRecord is a job: an agent opened on a caller's repository, its turns,
// and its work fetched back as a branch (a Shoal addition).
type JobRecord struct {
	ID     string    `json:"id"`
	Status JobStatus `json:"status"`
	// Repo is the caller's repository, Runner the host that runs the job.
	Repo   string `json:"repo"`
	Runner string `json:"runner"`
	Node   string `json:"node,omitempty"`
	// Turns are the prompt and its follow-ups; Done how many have ended.
	Turns     []string `json:"turns"`
	Done      int      `json:"done"`
	StartedAt float64  `json:"started_at"`
	EndedAt   float64  `json:"ended_at,omitempty"`
	// Beat is when the runner last wrote the record.
	Beat float64 `json:"beat"`
	// The work brought back: the branch, its commit, how many commits
	// and files, and git diff --stat against the start.
	Branch  string `json:"branch,omitempty"`
	Tip     string `json:"tip,omitempty"`
	Commits int    `json:"commits,omitempty"`
	Files   int    `json:"files,omitempty"`
	Stat    string `json:"stat,omitempty"`
	// Usage is what the agent's turns used, as its record sums it.
	Usage *Usage `json:"usage,omitempty"`
	Error string `json:"error,omitempty"`
}

// Ended reports whether the job has its outcome.
func (j JobRecord) Ended() bool { return j.Status == JobSucceeded || j.Status == JobFailed }

// JobRequest starts a job (agent_job): an agent on the repository at CWD
// of the endpoint's machine runs Prompt and each of Then, its work is
// fetched back as branch shoal/<id> there, and it is closed. Detach
// returns the job's id at once. With JobID alone, it waits for that job
// and returns its outcome.
type JobRequest struct {
	JobID       string            `json:"job_id,omitempty"`
	CWD         string            `json:"cwd,omitempty"`
	Prompt      string            `json:"prompt,omitempty"`
	Then        []string          `json:"then,omitempty"`
	Ref         string            `json:"ref,omitempty"`
	WithChanges bool              `json:"with_changes,omitempty"`
	Model       string            `json:"model,omitempty"`
	Permission  string            `json:"permission,omitempty"`
	Node        string            `json:"node,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Sandbox     *bool             `json:"sandbox,omitempty"`
	Timeout     float64           `json:"timeout,omitempty"`
	Detach      bool              `json:"detach,omitempty"`
}
