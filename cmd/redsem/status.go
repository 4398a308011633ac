//go:build unix

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
)

const statusHelp = `Usage: redsem status [--json] [connection flags] NAME

Shows a snapshot of semaphore NAME: its size, free slots, waiters, and each
holder with its slot, fence, label and time left. The holder label is
"host:pid command" for holders started by redsem run. When there is no
semaphore NAME but a read-write lock NAME (what redsem run NAME takes without
--size), it shows the lock: its readers, its writer and its queue.

  --json           print JSON instead of a table (exit code 0 also when the
                   semaphore does not exist: see "exists"). Keys are
                   snake_case, lists are never null, slots are numbers,
                   times RFC 3339, durations in ms (keys ending in _ms)

` + connHelp + `
Examples:
  redsem status nightly-backup
  redsem status --json encoders | jq '.available'
  REDIS_URL=rediss://:secret@redis.internal:6380/2 redsem status encoders
`

// opTimeout bounds status, reclaim and delete.
const opTimeout = 10 * time.Second

// openAdmin returns an Admin of the semaphore NAME for the commands that
// inspect or repair it: none of them needs its size.
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
	flags := func(fs *flag.FlagSet) { asJSON = fs.Bool("json", false, "") }
	return adminCommand("status", statusHelp, args, 1, flags, func(ctx context.Context, adm *admin.Handle, _ []string) error {
		st, err := adm.Status(ctx)
		if err != nil {
			return err
		}
		if !st.Exists {
			// redsem run NAME takes the read-write lock NAME by default:
			// show that lock when there is no semaphore of the name.
			rw, err := adm.RWStatus(ctx)
			if errors.Is(err, redsem.ErrWrongType) {
				return err // what redsem run NAME would fail on (exit 65)
			}
			if err == nil && rw.Exists {
				if *asJSON {
					return writeJSON(stdout, toRWStatusJSON(rw))
				}
				printRWStatus(stdout, rw)
				return nil
			}
		}
		if *asJSON {
			return writeJSON(stdout, toStatusJSON(st))
		}
		printStatus(stdout, st)
		return nil
	})
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
		fmt.Fprintf(w, "semaphore %q does not exist yet (the first acquire creates it)\n", st.Name)
		if st.Waiting > 0 {
			fmt.Fprintf(w, "waiting    %d\n", st.Waiting)
		}
		return
	}
	fmt.Fprintf(w, "semaphore  %s\n", st.Name)
	fmt.Fprintf(w, "size       %d\n", st.Size)
	fmt.Fprintf(w, "available  %d\n", st.Available)
	fmt.Fprintf(w, "held       %d\n", len(st.Holders))
	fmt.Fprintf(w, "waiting    %d\n", st.Waiting)
	if st.Stray > 0 || st.Rejected > 0 {
		fmt.Fprintf(w, "stray      %d (rejected so far: %d)\n", st.Stray, st.Rejected)
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
