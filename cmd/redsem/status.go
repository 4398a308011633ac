//go:build unix

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redsem/redsem"
)

const statusHelp = `Usage: redsem status [--json] [connection flags] NAME

Shows a snapshot of semaphore NAME: its size, free slots, waiters, and each
holder with its slot, fence, label and time left. The holder label is
"host:pid command" for holders started by redsem run.

  --json           print JSON instead of a table (exit code 0 also when the
                   semaphore does not exist: see "exists")

` + connHelp + `
Examples:
  redsem status nightly-backup
  redsem status --json encoders | jq '.available'
  REDIS_URL=rediss://:secret@redis.internal:6380/2 redsem status encoders
`

// opTimeout bounds status, reclaim and delete.
const opTimeout = 10 * time.Second

// openSemaphore returns the semaphore NAME for status, reclaim and delete:
// they do not depend on the size, so any valid size does.
func openSemaphore(c connFlags, name string) (*redsem.Semaphore, *pools, error) {
	p, err := connect(c)
	if err != nil {
		return nil, nil, err
	}
	sem, err := redsem.NewSemaphore(p.main, name, 1, redsem.WithPrefix(c.prefix))
	if err != nil {
		p.Close()
		return nil, nil, err
	}
	return sem, p, nil
}

func cmdStatus(args []string, stdout, _ io.Writer) error {
	var asJSON *bool
	flags := func(fs *flag.FlagSet) { asJSON = fs.Bool("json", false, "") }
	return adminCommand("status", statusHelp, args, 1, flags, func(ctx context.Context, sem *redsem.Semaphore, _ []string) error {
		st, err := sem.Status(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(toJSON(st))
		}
		printStatus(stdout, st)
		return nil
	})
}

// statusJSON is the --json form of a status; field names are stable.
type statusJSON struct {
	Name       string       `json:"name"`
	Exists     bool         `json:"exists"`
	Size       int          `json:"size"`
	Available  int          `json:"available"`
	Held       int          `json:"held"`
	Waiting    int          `json:"waiting"`
	Stray      int          `json:"stray"`
	Rejected   int64        `json:"rejected"`
	Epoch      string       `json:"epoch"`
	ServerTime time.Time    `json:"server_time"`
	Holders    []holderJSON `json:"holders"`
}

type holderJSON struct {
	Slot      string    `json:"slot"`
	Token     string    `json:"token"`
	Fence     int64     `json:"fence"`
	Label     string    `json:"label"`
	Acquired  time.Time `json:"acquired"`
	Deadline  time.Time `json:"deadline"`
	TTLLeftMs int64     `json:"ttl_left_ms"`
	Expired   bool      `json:"expired"`
}

func toJSON(st redsem.Status) statusJSON {
	out := statusJSON{
		Name: st.Name, Exists: st.Exists, Size: st.Size, Available: st.Available,
		Held: len(st.Holders), Waiting: st.Waiting, Stray: st.Stray, Rejected: st.Rejected,
		Epoch: st.Epoch, ServerTime: st.ServerTime, Holders: []holderJSON{},
	}
	for _, h := range st.Holders {
		out.Holders = append(out.Holders, holderJSON{
			Slot: slotOf(h.Token), Token: h.Token, Fence: h.Fence, Label: h.Label,
			Acquired: h.Acquired, Deadline: h.Deadline,
			TTLLeftMs: max(0, h.Deadline.Sub(st.ServerTime).Milliseconds()), Expired: h.Expired,
		})
	}
	return out
}

// slotOf returns the slot part of a token ("3f2a9c0d41be:2" -> "2").
func slotOf(token string) string {
	if i := strings.LastIndexByte(token, ':'); i >= 0 {
		return token[i+1:]
	}
	return token
}

func printStatus(w io.Writer, st redsem.Status) {
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
