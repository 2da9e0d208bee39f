package dlock_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func usecOf(ctx context.Context, rc *redis.Client) (float64, float64) {
	out, _ := rc.Info(ctx, "commandstats").Result()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "cmdstat_evalsha:") {
			var c, u float64
			for _, f := range strings.Split(strings.TrimPrefix(strings.TrimSpace(l), "cmdstat_evalsha:"), ",") {
				k, v, _ := strings.Cut(f, "=")
				x, _ := strconv.ParseFloat(v, 64)
				switch k {
				case "calls":
					c = x
				case "usec":
					u = x
				}
			}
			return c, u
		}
	}
	return 0, 0
}

func TestZZPerf2(t *testing.T) {
	ctx := context.Background()
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:7999"})
	defer rc.Close()
	load := func(p string) string {
		b, _ := os.ReadFile(p)
		sha, err := rc.ScriptLoad(ctx, string(b)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return sha
	}
	acq, rel, sh := load("scripts/acquire.lua"), load("scripts/release.lua"), load("scripts/shared.lua")
	pidb, _ := os.ReadFile("/tmp/r7999.pid")
	pid := strings.TrimSpace(string(pidb))
	cpu := func() float64 {
		b, _ := os.ReadFile("/proc/" + pid + "/stat")
		f := strings.Fields(string(b)[strings.LastIndex(string(b), ")")+2:])
		u, _ := strconv.ParseFloat(f[11], 64)
		s, _ := strconv.ParseFloat(f[12], 64)
		return (u + s) * 10000 // µs (100 Hz ticks)
	}
	run := func(name string, f func(i int)) {
		rc.ConfigResetStat(ctx)
		c0 := cpu()
		for i := range 6000 {
			f(i)
		}
		c, u := usecOf(ctx, rc)
		t.Logf("%-8s %.1f µs per script (commandstats), %.1f µs server CPU per script", name, u/c, (cpu()-c0)/c)
	}
	mk := "dlock:{m}"
	sk := []string{"dlock:{s}:sem", "dlock:{s}:sem:q", "dlock:{s}:sem:w"}
	for range 2 {
		run("sem-acq", func(i int) {
			o := "owner:" + strconv.Itoa(i)
			rc.EvalSha(ctx, sh, []string{"dlock:{x}:sem", "dlock:{x}:sem:q", "dlock:{x}:sem:w"}, "a", o, "10000", "{}", "", "c", "p", "", "1000", "sem", "1", "1000000", "", "")
		})
		run("sem-rel", func(i int) {
			o := "owner:" + strconv.Itoa(i)
			rc.EvalSha(ctx, sh, []string{"dlock:{x}:sem", "dlock:{x}:sem:q", "dlock:{x}:sem:w"}, "r", o, "60000", "c", "p", "1", "sem", "1000000", "")
		})
		run("sem-t", func(i int) {
			rc.EvalSha(ctx, sh, []string{"dlock:{x}:sem"}, "t", "o")
		})
	}
	for range 1 {
		run("mutex", func(i int) {
			o := "owner:" + strconv.Itoa(i)
			rc.EvalSha(ctx, acq, []string{mk, mk + ":q", mk + ":w"}, o, "10000", "{}", "", mk+":rel", "p", "", "1000")
			rc.EvalSha(ctx, rel, []string{mk, mk + ":q", mk + ":w"}, o, "60000", mk+":rel", "1", "p", "0")
		})
		run("sem", func(i int) {
			o := "owner:" + strconv.Itoa(i)
			if err := rc.EvalSha(ctx, sh, sk, "a", o, "10000", "{}", "", sk[0]+":rel", "p", "", "1000", "sem", "1", "64", "", "").Err(); err != nil {
				t.Fatal(err)
			}
			rc.EvalSha(ctx, sh, sk, "r", o, "60000", sk[0]+":rel", "p", "1", "sem", "64", "")
		})
	}
}
