package engine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gomodule/redigo/redis"
)

// The sentinels both packages return. redsem and rate export these very
// values, so errors.Is matches either package's name for them.
var (
	ErrWrongType     = errors.New("redsem: key holds the wrong type")
	ErrCorrupt       = errors.New("redsem: semaphore state is corrupt")
	ErrOutOfMemory   = errors.New("redsem: redis is out of memory")
	ErrInvalidName   = errors.New("redsem: invalid name")
	ErrInvalidSize   = errors.New("redsem: invalid size")
	ErrInvalidOption = errors.New("redsem: invalid option")
	ErrStaleGrant    = errors.New("redsem: grants arrive after their lease ends")
	// ErrNoToken and ErrRateLimited are redsem.ErrNoToken and
	// rate.ErrRateLimited, here so that admin.Counters can count a refused
	// try or start as busy without importing either package.
	ErrNoToken     = errors.New("redsem: no token free")
	ErrRateLimited = errors.New("redsem: rate limited")
	// ErrLayout is ErrWrongType for a name of the layout before protocol v2
	// (meta.lua's read_meta): errors.Is matches both, and the CLI tells it
	// apart from a stranger's key, which only deleting the name clears.
	ErrLayout = fmt.Errorf("%w", ErrWrongType)
)

// ScriptError turns the error replies the scripts share, and those of Redis
// itself, into the sentinels: ErrWrongType, ErrOutOfMemory, ErrCorrupt.
// Other errors pass through, wrapped. kind and name say whose script ran
// ("semaphore", "rate gate"); replies a kind has of its own (a size or rate
// mismatch) are for the caller to map first.
func ScriptError(op, kind, name string, err error) error {
	var re redis.Error
	if !errors.As(err, &re) {
		return fmt.Errorf("redsem: %s %s %q: %w", op, kind, Printable(name), err)
	}
	msg := string(re)
	switch {
	case strings.HasPrefix(msg, "REDSEM_WRONGTYPE "):
		return fmt.Errorf("%w: %s", ErrWrongType, strings.TrimPrefix(msg, "REDSEM_WRONGTYPE "))
	case strings.Contains(msg, "WRONGTYPE"):
		return fmt.Errorf("%w: %s %q: %s", ErrWrongType, kind, Printable(name), msg)
	case strings.HasPrefix(msg, "OOM "):
		return fmt.Errorf("%w: %s %q: %s", ErrOutOfMemory, kind, Printable(name), msg)
	case strings.HasPrefix(msg, "REDSEM_LAYOUT "):
		return fmt.Errorf("%w: %s", ErrLayout, strings.TrimPrefix(msg, "REDSEM_LAYOUT "))
	case strings.HasPrefix(msg, "REDSEM_CORRUPT "):
		return fmt.Errorf("%w: %s", ErrCorrupt, strings.TrimPrefix(msg, "REDSEM_CORRUPT "))
	}
	return fmt.Errorf("redsem: %s %s %q: %w", op, kind, Printable(name), err)
}
