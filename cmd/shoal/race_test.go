//go:build race

package main

// raceEnabled says the test binary runs under the race detector, whose
// shadow memory and slowness a memory bound or a firehose must allow for.
const raceEnabled = true
