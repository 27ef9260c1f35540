package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version or "devel".
var version = ""

func versionString() string {
	v := version
	if v == "" {
		v = "devel"
		if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
	}
	return fmt.Sprintf("shoal %s (%s, %s/%s)", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// semver is the version as a service may report it: MAJOR.MINOR.PATCH
// with an optional pre-release, "0.0.0-devel" for a development build.
func semver() string {
	v := version
	if v == "" {
		if info, ok := debug.ReadBuildInfo(); ok {
			v = info.Main.Version
		}
	}
	v = strings.TrimPrefix(v, "v")
	if v == "" || v == "(devel)" || strings.Count(strings.SplitN(v, "-", 2)[0], ".") != 2 {
		return "0.0.0-devel"
	}
	return v
}

func versionCommand() *command {
	return &command{
		name:    "version",
		summary: "print the version",
		help:    "Prints shoal's version, the Go version it was built with, and its platform.",
		flags: func(*flag.FlagSet) runner {
			return func(_ context.Context, env *environment, _ []string) error {
				fmt.Fprintln(env.io.out, versionString())
				return nil
			}
		},
	}
}
