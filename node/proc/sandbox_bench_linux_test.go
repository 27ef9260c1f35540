package proc_test

import (
	"os"
	"testing"
	"time"

	"github.com/shoalfabric/shoal/node/proc"
)

// BenchmarkSandboxStart starts /bin/true through the reaper three ways,
// alternating in one run: plain, with Landlock and seccomp, and in
// namespaces of its own around them; it reports each one's milliseconds
// and the two ratios to plain.
func BenchmarkSandboxStart(b *testing.B) {
	exe, _ := os.Executable()
	r, err := proc.StartReaper(exe)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	cwd := b.TempDir()
	var took [3]time.Duration
	for b.Loop() {
		for i, box := range []*proc.Confinement{nil,
			{Exe: exe, Writable: []string{cwd}, Readable: proc.SystemReadable},
			{Exe: exe, Writable: []string{cwd}, Readable: proc.SystemReadable, Namespaces: true}} {
			t0 := time.Now()
			p, out, err := proc.StartProcess(proc.ProcessSpec{Argv: []string{"/bin/true"}, Dir: cwd, Env: []string{"PATH=/usr/bin:/bin"}, Reaper: r, Sandbox: box})
			if err != nil {
				b.Fatal(err)
			}
			out.Close()
			<-p.Done()
			if err := p.Err(); err != nil {
				b.Fatalf("way %d: %v: %s", i, err, p.StderrTail())
			}
			took[i] += time.Since(t0)
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(took[0]), "plain-ms")
	b.ReportMetric(ms(took[1]), "landlock-ms")
	b.ReportMetric(ms(took[2]), "namespaces-ms")
	b.ReportMetric(float64(took[2])/float64(took[0]), "namespaces-ratio")
}
