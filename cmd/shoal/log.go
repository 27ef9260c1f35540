package main

import (
	"flag"
	"fmt"
	"log/slog"
)

// logOptions are the logging settings of shoal up and shoal node.
type logOptions struct {
	level  string
	format string
}

func (o *logOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.level, "log-level", "info", "`level` of the log: debug, info, warn or error")
	fs.StringVar(&o.format, "log-format", "text", "`format` of the log on stderr and the status lines on stdout: text or json")
}

// daemonLog is a daemon's one logger, on stderr, and its status lines on
// stdout: what it listens on, that it is ready, that it stopped. As text
// a status line is "shoal: …", the form scripts wait for; as JSON it is a
// record like the log's, its message the same words.
type daemonLog struct {
	*slog.Logger
	status func(format string, args ...any)
}

// open makes the daemon's logger and hands it to env, so that a failure
// and a warning on the way are logged too.
func (o *logOptions) open(env *environment) (*daemonLog, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(o.level)); err != nil {
		return nil, usagef("--log-level %q is not a level (debug, info, warn or error)", o.level)
	}
	opts := &slog.HandlerOptions{Level: l}
	d := &daemonLog{}
	switch o.format {
	case "text":
		d.Logger = slog.New(slog.NewTextHandler(env.io.err, opts))
		d.status = func(format string, args ...any) { fmt.Fprintf(env.io.out, "shoal: "+format+"\n", args...) }
	case "json":
		d.Logger = slog.New(slog.NewJSONHandler(env.io.err, opts))
		// Status lines show whatever the level, as they do as text.
		status := slog.New(slog.NewJSONHandler(env.io.out, nil))
		d.status = func(format string, args ...any) { status.Info(fmt.Sprintf(format, args...)) }
		env.logJSON = true
	default:
		return nil, usagef("--log-format %q is not text or json", o.format)
	}
	env.log = d.Logger
	return d, nil
}
