//go:build unix

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/rate"
)

const statusHelp = `Usage: redsem status [--json] [--kind K] [connection flags] NAME

Shows a snapshot of NAME, whatever its kind, and says which kind it is:
  semaphore, mutex  size, free slots, waiters, and each holder with its slot,
                    fence, label and time left
  rwmutex           readers, writer and queue (what redsem run NAME takes
                    without --size)
  rate              limits, starts in the window, starts possible now,
                    waiters (the same as redsem rate status)
  election          the leader (its value, term, label and time left),
                    waiting campaigners and observers (redsem leader NAME
                    shows the leader alone)
The holder label is "host:pid command" for holders started by redsem run.
A NAME that does not exist is not an error: status says so and exits 0.
A corrupt NAME is (exit 65, as for run): a record of the wrong shape, a key
of another type than redsem writes, tokens without their record.

  --json           print JSON instead of a table ("kind" says which, "none"
                   when NAME does not exist; "exists" false then). Keys are
                   snake_case, lists are never null, slots are numbers,
                   times RFC 3339, durations in ms (keys ending in _ms)
  --kind K         semaphore (or mutex), rwmutex, rate or election: which one
                   when NAME names several (default: the first of them in
                   that order; the others are listed in "kinds")

` + connHelp + `
Examples:
  redsem status nightly-backup
  redsem status --json encoders | jq '.available'
  REDIS_URL=rediss://:secret@redis.internal:6380/2 redsem status encoders
`

// opTimeout bounds status, reclaim and delete.
const opTimeout = 10 * time.Second

// openAdmin returns a Handle of NAME for the commands that inspect or
// repair it: none of them needs its size.
func openAdmin(c connFlags, name string) (*admin.Handle, *pools, error) {
	p, err := connect(c)
	if err != nil {
		return nil, nil, err
	}
	a, err := admin.New(p.main, c.prefix, name)
	if err != nil {
		p.Close()
		return nil, nil, err
	}
	return a, p, nil
}

func cmdStatus(args []string, stdout, _ io.Writer) error {
	var asJSON *bool
	var kind *kindFlag
	flags := func(fs *flag.FlagSet) {
		asJSON = fs.Bool("json", false, "")
		kind = registerKind(fs)
	}
	return adminCommand("status", statusHelp, args, 1, flags, func(ctx context.Context, n *named, _ []string) error {
		k, ok := n.pick(kind.k)
		if !ok && len(n.kinds) == 0 {
			if err := readLeftovers(ctx, n); err != nil {
				return err
			}
		}
		if !ok {
			if *asJSON {
				return writeJSON(stdout, noneJSON{Kind: kindNone, Name: n.name, Kinds: kindNames(n.kinds)})
			}
			what := "semaphore, mutex, read-write lock, rate gate or election"
			if kind.k != "" {
				what = kindWords(kind.k)
			}
			fmt.Fprintf(stdout, "%q does not exist (no %s of that name under prefix %q)\n", n.name, what, n.prefix)
			if len(n.kinds) > 0 {
				fmt.Fprintln(stdout, alsoLine(n.name, n.kinds))
			}
			return nil
		}
		doc, print, err := readStatus(ctx, n, k)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, doc)
		}
		print(stdout)
		if others := n.others(k); len(others) > 0 && kind.k == "" {
			fmt.Fprintln(stdout)
			fmt.Fprintln(stdout, alsoLine(n.name, others))
		}
		return nil
	})
}

// readLeftovers fails, as an acquisition would, on the keys of a NAME that
// has no record of any kind: a key of another type than its layout's, or
// keys the kind's record should come with (a semaphore's tokens without
// its meta). Keys an acquisition takes in its stride (a tombstone) pass.
func readLeftovers(ctx context.Context, n *named) error {
	keys, err := n.adm.Keys(ctx)
	if err != nil {
		return err
	}
	seen := map[admin.Kind]bool{}
	for _, k := range keys {
		if want := expectedType(k.Key); k.Type != want {
			return fmt.Errorf("%w: %s holds a %s, want a %s", redsem.ErrWrongType, k.Key, k.Type, want)
		}
		seen[k.Kind] = true
	}
	for _, k := range []admin.Kind{admin.KindSemaphore, admin.KindRWMutex, admin.KindRate} {
		if seen[k] {
			if _, _, err := readStatus(ctx, n, k); err != nil {
				return err
			}
		}
	}
	return nil
}

// readStatus reads NAME as kind k and returns its status --json document
// and a function that prints its table.
func readStatus(ctx context.Context, n *named, k admin.Kind) (any, func(io.Writer), error) {
	kinds := kindNames(n.kinds)
	switch k {
	case admin.KindRWMutex:
		st, err := n.adm.RWStatus(ctx)
		if err != nil {
			return nil, nil, err
		}
		doc := toRWStatusJSON(st)
		doc.Kinds = kinds
		return doc, func(w io.Writer) { printRWStatus(w, st) }, nil
	case admin.KindRate:
		st, err := rate.ReadStatus(ctx, n.pool, n.prefix, n.name)
		if err != nil {
			return nil, nil, err
		}
		doc := toRateStatusJSON(st)
		doc.Kinds = kinds
		return doc, func(w io.Writer) { printRateStatus(w, st) }, nil
	case admin.KindElection:
		st, err := n.adm.ElectionStatus(ctx)
		if err != nil {
			return nil, nil, err
		}
		doc := toElectionJSON(st)
		doc.Kinds = kinds
		return doc, func(w io.Writer) { printElectionStatus(w, st) }, nil
	}
	st, err := n.adm.Status(ctx)
	if err != nil {
		return nil, nil, err
	}
	doc := toStatusJSON(st)
	doc.Kinds = kinds
	return doc, func(w io.Writer) { printStatus(w, st) }, nil
}

// slotOf returns the slot part of a token ("3f2a9c0d41be:2" -> "2").
func slotOf(token string) string {
	if i := strings.LastIndexByte(token, ':'); i >= 0 {
		return token[i+1:]
	}
	return token
}

func printStatus(w io.Writer, st admin.Status) {
	if !st.Exists {
		// Deleted between the look-up and the read.
		fmt.Fprintf(w, "semaphore %q does not exist (the first acquire creates it)\n", st.Name)
		return
	}
	fmt.Fprintf(w, "%-10s %s\n", semKind(st.Size), st.Name)
	fmt.Fprintf(w, "size       %d\n", st.Size)
	fmt.Fprintf(w, "available  %d\n", st.Available)
	fmt.Fprintf(w, "held       %d\n", len(st.Holders))
	fmt.Fprintf(w, "waiting    %d\n", st.Waiting)
	switch {
	case st.Stray > 0:
		fmt.Fprintf(w, "stray      %d (rejected so far: %d): unhealthy, redsem repair %s drops them\n",
			st.Stray, st.Rejected, shellQuote(st.Name))
	case st.Rejected > 0:
		fmt.Fprintf(w, "stray      0 (rejected so far: %d)\n", st.Rejected)
	}
	if st.IdleExpiresIn > 0 {
		fmt.Fprintf(w, "expires    in %v (idle; the next use keeps it)\n", st.IdleExpiresIn.Round(time.Millisecond))
	} else if st.IdleExpiry > 0 {
		fmt.Fprintf(w, "expires    %v after it is left idle\n", st.IdleExpiry)
	}
	if len(st.Holders) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tFENCE\tHELD FOR\tTIME LEFT\tLABEL")
	for _, h := range st.Holders {
		left := "expired"
		if !h.Expired {
			left = h.Deadline.Sub(st.ServerTime).Round(100 * time.Millisecond).String()
		}
		held := "?"
		if !h.Acquired.IsZero() {
			held = st.ServerTime.Sub(h.Acquired).Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", slotOf(h.Token), h.Fence, held, left, h.Label)
	}
	tw.Flush()
}

func printElectionStatus(w io.Writer, st admin.ElectionStatus) {
	fmt.Fprintf(w, "election   %s\n", st.Name)
	if h := st.Leader; h != nil {
		fmt.Fprintf(w, "leader     %s\n", st.Value)
		fmt.Fprintf(w, "term       %d\n", h.Fence)
		fmt.Fprintf(w, "label      %s\n", h.Label)
		fmt.Fprintf(w, "time left  %s\n", h.Deadline.Sub(st.ServerTime).Round(100*time.Millisecond))
	} else {
		fmt.Fprintf(w, "leader     none (nobody leads)\n")
	}
	fmt.Fprintf(w, "waiting    %d\n", st.Waiting)
	fmt.Fprintf(w, "observers  %d\n", st.Observers)
}

func printRWStatus(w io.Writer, st admin.RWStatus) {
	fmt.Fprintf(w, "rwmutex    %s\n", st.Name)
	fmt.Fprintf(w, "readers    %d\n", len(st.Readers))
	writer := "none"
	if st.Writer != nil {
		writer = "1"
	}
	fmt.Fprintf(w, "writer     %s\n", writer)
	fmt.Fprintf(w, "waiting    %d\n", len(st.Queue))
	holders := rwHolders(st)
	if len(holders) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SIDE\tFENCE\tHELD FOR\tTIME LEFT\tLABEL")
		for _, h := range holders {
			left := "expired"
			if !h.Expired {
				left = h.Deadline.Sub(st.ServerTime).Round(100 * time.Millisecond).String()
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", sideOf(h, st), h.Fence,
				st.ServerTime.Sub(h.Acquired).Round(100*time.Millisecond), left, h.Label)
		}
		tw.Flush()
	}
	if len(st.Queue) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "QUEUED\tSIDE\tLABEL")
		for i, q := range st.Queue {
			side := "read"
			if q.Write {
				side = "write"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\n", i+1, side, q.Label)
		}
		tw.Flush()
	}
}

// rwHolders lists the lock's writer, if any, then its readers.
func rwHolders(st admin.RWStatus) []admin.Holder {
	var hs []admin.Holder
	if st.Writer != nil {
		hs = append(hs, *st.Writer)
	}
	return append(hs, st.Readers...)
}

func sideOf(h admin.Holder, st admin.RWStatus) string {
	if st.Writer != nil && h == *st.Writer {
		return "write"
	}
	return "read"
}
