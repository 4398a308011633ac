//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/redsem/redsem"
)

const leaderHelp = `Usage: redsem leader [--json] [--watch] [connection flags] NAME

Prints who leads the election NAME (redsem elect, or redsem.Election): its
value and term, or that nobody leads, and exits 0 either way.

  --watch   print the leader, then a line for every change (a new leader, a
            new value, nobody leading), in order, each once, until INT or
            TERM (exit 0). It waits in Redis: no command while nothing
            changes, and a crashed leader is reported gone within its TTL
  --json    one JSON object a line:
            {"kind":"election","name":...,"leading":true,"term":N,"value":...}
            ("leading":false, term 0 and value "" when nobody leads)

` + connHelp + `
Examples:
  redsem leader scheduler
  redsem leader --watch --json scheduler | jq -r .value
`

// leaderJSON is leader --json: one election's leader.
type leaderJSON struct {
	Kind    string `json:"kind"` // "election"
	Name    string `json:"name"`
	Leading bool   `json:"leading"`
	Term    int64  `json:"term"`
	Value   string `json:"value"`
}

func cmdLeader(args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("leader")
	var c connFlags
	c.register(fs)
	asJSON := fs.Bool("json", false, "")
	watch := fs.Bool("watch", false, "")
	pos, err := parseArgs(fs, args, leaderHelp)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("leader: expected one NAME (see redsem leader --help)")
	}
	name := pos[0]
	p, err := connect(c)
	if err != nil {
		return err
	}
	defer p.Close()
	e, err := redsem.NewElection(p.main, name, redsem.WithPrefix(c.prefix), redsem.WithBlockingPool(p.block))
	if err != nil {
		return err
	}
	show := func(l redsem.Leader) {
		switch {
		case *asJSON:
			b, _ := json.Marshal(leaderJSON{Kind: "election", Name: name, Leading: l.Term != 0, Term: l.Term, Value: l.Value})
			fmt.Fprintf(stdout, "%s\n", b)
		case l.Term == 0:
			fmt.Fprintf(stdout, "%q: nobody leads\n", name)
		default:
			fmt.Fprintf(stdout, "%q: %s leads, term %d\n", name, l.Value, l.Term)
		}
	}
	if !*watch {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		l, err := e.Leader(ctx)
		if err != nil {
			return err
		}
		show(l)
		return nil
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err = e.Observe(ctx, func(l redsem.Leader) {
		show(l)
		if f, ok := stdout.(*os.File); ok {
			_ = f.Sync()
		}
	})
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
