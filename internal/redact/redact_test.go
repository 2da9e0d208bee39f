package redact

import "testing"

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://127.0.0.1:6379/0":                         "redis://127.0.0.1:6379/0",
		"redis://user:secret@127.0.0.1:6379/0":             "redis://user:xxxxx@127.0.0.1:6379/0",
		"redis://:secret@host:6379":                        "redis://:xxxxx@host:6379",
		"rediss://u:p%40ss@host:6380/1?addr=h2:1":          "rediss://u:xxxxx@host:6380/1?addr=h2:1",
		"redis+sentinel://u:s3cr:et@s1:26379,s2:26379/m/0": "redis+sentinel://u:xxxxx@s1:26379,s2:26379/m/0",
		"user:secret@host:6379":                            "user:xxxxx@host:6379",
		"redis://user@host:6379":                           "redis://user@host:6379",
		"redis://host:6379/0?x=a@b":                        "redis://host:6379/0?x=a@b",
		"unix:///tmp/redis.sock":                           "unix:///tmp/redis.sock",
		"redis://u:pw@with@at@host:1":                      "redis://u:xxxxx@host:1",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestText(t *testing.T) {
	if got := Text("dial redis://u:pw1@h: refused", "pw1"); got != "dial redis://u:xxxxx@h: refused" {
		t.Fatal(got)
	}
	if got := Text(`invalid URL escape "%zz"`, "sek%zzret"); got != `invalid URL escape "xxxxx"` {
		t.Fatal(got)
	}
	if got := Text(`a "quoted" word`, "pw"); got != `a "quoted" word` {
		t.Fatal(got)
	}
	if got := Text("no secret", ""); got != "no secret" {
		t.Fatal(got)
	}
}
