//go:build race

package main

// A race-enabled test run builds the command with the race detector too, so that a data race
// in the workers or in the demo's parent fails the demo tests.
func init() { buildFlags = append(buildFlags, "-race") }
