//go:build !unix

package main

import "errors"

// selfUsage is not measured here.
func selfUsage() usage { return usage{} }

func niceThread() error { return errors.New("thread priorities are not set on this system") }
