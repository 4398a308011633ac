//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redsem/redsem/rate"
)

const rateHelp = `Usage: redsem rate set [connection flags] NAME LIMIT [LIMIT...]

Sets the limits of rate gate NAME for every client at once (and creates it
if it does not exist). LIMIT is N/PER: at most N units in any window of
length PER (100/1s, 200000/1m); a quota of several limits takes one LIMIT
per limit, in its order. From then on every client follows the stored
limits, whatever it was started with. Waiters are re-timed at once; those
asking for more than a lowered N fail. docs/rate-gate.md states the rule a
start is held to across a change.

` + connHelp + `
Examples:
  redsem rate set partner-api 50/1s
  redsem rate set llm-api 500/1m 300000/1m
`

func cmdRate(args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("rate")
	var c connFlags
	c.register(fs)
	pos, err := parseArgs(fs, args, rateHelp)
	if err != nil {
		return err
	}
	if len(pos) < 3 || pos[0] != "set" {
		return usagef("rate: expected set NAME LIMIT... (see redsem rate --help)")
	}
	name := pos[1]
	var limits []rate.Limit
	for _, s := range pos[2:] {
		l, err := parseLimit(s)
		if err != nil {
			return usagef("rate: %v", err)
		}
		limits = append(limits, l)
	}
	p, err := connect(c)
	if err != nil {
		return err
	}
	defer p.Close()
	q, err := rate.NewQuota(p.main, name, limits, rate.WithPrefix(c.prefix))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := q.SetLimits(ctx, limits...); err != nil {
		return err
	}
	parts := make([]string, len(limits))
	for i, l := range limits {
		parts[i] = l.String()
	}
	fmt.Fprintf(stdout, "%q now admits %s\n", name, strings.Join(parts, " and "))
	return nil
}

// parseLimit reads N/PER.
func parseLimit(s string) (rate.Limit, error) {
	n, per, ok := strings.Cut(s, "/")
	l := rate.Limit{}
	var err1, err2 error
	l.N, err1 = strconv.Atoi(n)
	l.Per, err2 = time.ParseDuration(per)
	if !ok || err1 != nil || err2 != nil {
		return l, fmt.Errorf("%q is not a limit N/PER such as 100/1s", s)
	}
	return l, nil
}
