// Command electworker is the campaigner process of redsem's fault suite: it
// campaigns in an election, and while it leads writes, every few
// milliseconds, to a fenced resource in Redis (a script that accepts a term
// at least the highest it has seen), checking Leadership.Valid before each
// write; after -hold it resigns and campaigns again. It appends one line per
// step to -log:
//
//	lead ID TERM              Campaign returned
//	write ID TERM ok|refused  a write while Valid (refused while still Valid: two leaders)
//	lost ID TERM              Valid turned false (stopped past the TTL, cut off)
//	stale ID TERM ok|refused  one write right after, as a leader that did not check would
//	resign ID TERM            Resign returned
//
// Exit codes: 0 done, 2 bad flags, 3 a library error.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
)

var (
	addr  = flag.String("addr", "", "redis host:port")
	name  = flag.String("name", "faults", "election name")
	ttl   = flag.Duration("ttl", time.Second, "leadership TTL")
	id    = flag.Int("id", 0, "worker id")
	log   = flag.String("log", "", "log file")
	hold  = flag.Duration("hold", 200*time.Millisecond, "how long each leadership lasts")
	every = flag.Duration("every", 5*time.Millisecond, "pause between writes")
	iters = flag.Int("iters", 0, "leaderships to hold (0: for ever)")
)

// fenced is the guarded resource: it accepts a write whose term is at least
// the highest it accepted.
var fenced = redis.NewScript(1, `
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < cur then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1`)

func main() {
	flag.Parse()
	f, err := os.OpenFile(*log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	logf := func(format string, a ...any) { _, _ = fmt.Fprintf(f, format+"\n", a...) }
	pool := &redis.Pool{MaxIdle: 8, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", *addr)
	}}
	write := func(term int64) string {
		c := pool.Get()
		defer c.Close()
		ok, err := redis.Int(fenced.Do(c, "fenced:"+*name, term))
		switch {
		case err != nil:
			return "error"
		case ok == 1:
			return "ok"
		}
		return "refused"
	}
	e, err := redsem.NewElection(pool, *name, redsem.WithTTL(*ttl))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := context.Background()
	for i := 0; *iters == 0 || i < *iters; i++ {
		lead, err := e.Campaign(ctx, fmt.Sprint("w", *id))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		term := lead.Term()
		logf("lead %d %d", *id, term)
		for end := time.Now().Add(*hold); time.Now().Before(end); time.Sleep(*every) {
			if !lead.Valid() {
				logf("lost %d %d", *id, term)
				logf("stale %d %d %s", *id, term, write(term))
				break
			}
			r := write(term)
			if r == "refused" && !lead.Valid() {
				// Stopped between the check and the write: the fence
				// refused what the check could no longer stop.
				logf("lost %d %d", *id, term)
				logf("stale %d %d %s", *id, term, r)
				break
			}
			logf("write %d %d %s", *id, term, r)
		}
		_ = lead.Resign(ctx)
		logf("resign %d %d", *id, term)
	}
}
