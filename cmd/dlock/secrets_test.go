package main

import (
	"strings"
	"testing"
)

// Whatever the command prints about a server it cannot use, it never prints the password of
// the URL it was given (by --redis or DLOCK_REDIS_URL).
func TestSecrets_CommandNeverPrintsPasswords(t *testing.T) {
	const secret = "s3cr%zzet-pw"
	for _, url := range []string{
		"redis://user:" + secret + "@127.0.0.1:1/0",
		"redis://user:" + secret + "@127.0.0.1:notaport/0",
		"redis+sentinel://user:" + secret + "@127.0.0.1:1/mymaster",
	} {
		for _, args := range [][]string{
			{"status", "--redis", url, "name"},
			{"list", "--redis", url},
			{"unlock", "--force", "--redis", url, "name"},
			{"run", "--redis", url, "--wait", "0", "name", "--", "true"},
			{"web", "--redis", url, "--listen", "127.0.0.1:0"},
		} {
			stdout, stderr, code := dlockCmd(t, args...)
			if code == 0 {
				t.Fatalf("dlock %v succeeded", args)
			}
			for _, part := range []string{secret, "s3cr", "%zz", "zzet"} {
				if strings.Contains(stdout+stderr, part) {
					t.Fatalf("dlock %v printed (part of) the password:\n%s%s", args, stdout, stderr)
				}
			}
		}
	}
}
