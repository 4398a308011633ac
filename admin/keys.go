package admin

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Key is one Redis key of a name, as Keys and Purge report it.
type Key struct {
	Key  string
	Type string // Redis's TYPE: "hash", "list", "zset", "string", ...
	Kind Kind   // the layout the key belongs to
}

// keysScript lists (ARGV[1] "list") or deletes every key of one name under
// the four layouts (semaphore, read-write lock, rate gate, election):
// whatever their type (ARGV[1] "purge"), or only when each has its layout's
// type (ARGV[1] "delete": else REDSEM_WRONGTYPE, and nothing written); or it
// reports the TYPE of the four meta keys (ARGV[1] "kinds"). KEYS are the
// fixed keys, the four meta keys first; ARGV[2..5] are the four layouts'
// bases, and ARGV[6..] the types of KEYS, in order. The keys named after an
// acquisition in flight (a semaphore's or an election's pend:, bell: and
// part: keys, a lock's bell:, a gate's in:, an election observer's ob:),
// all lists, are found through the ids the fixed keys of the right type
// hold: members of the sorted sets and lists, fields of the hashes, each
// taken as is, without its "w:"-style tag, and up to a "|". Every key
// shares the name's hash tag, as every script's do.
var keysScript = engine.Lua(-1, `
local mode = ARGV[1]
if mode == 'kinds' then
  local out = {}
  for i = 1, 4 do out[i] = redis.call('TYPE', KEYS[i])['ok'] end
  return out
end
local out, seen, wrong = {}, {}, nil
local function add(k, want)
  if seen[k] then return end
  seen[k] = true
  local t = redis.call('TYPE', k)['ok']
  if t ~= 'none' then
    out[#out + 1] = k
    out[#out + 1] = t
    if t ~= want and not wrong then wrong = k .. ' holds a ' .. t .. ', want a ' .. want end
  end
end
for i, k in ipairs(KEYS) do add(k, ARGV[5 + i]) end
local function ids_of(k)
  local t, items = redis.call('TYPE', k)['ok'], {}
  if t == 'zset' then items = redis.call('ZRANGE', k, 0, -1)
  elseif t == 'list' then items = redis.call('LRANGE', k, 0, -1)
  elseif t == 'hash' then items = redis.call('HKEYS', k)
  end
  local ids = {}
  for _, m in ipairs(items) do
    ids[m] = true
    ids[string.match(m, '^([^|]+)') or m] = true
    local rest = string.match(m, '^%a:(.+)$')
    if rest then
      ids[rest] = true
      ids[string.match(rest, '^([^|]+)') or rest] = true
    end
  end
  return ids
end
-- base, the keys holding ids, the keys named after an id
local layouts = {
  {ARGV[2], {'meta', 'holders', 'waits', 'wqueue'}, {'pend:', 'bell:', 'part:'}},
  {ARGV[3], {'holders', 'queue', 'waits', 'leases'}, {'bell:'}},
  {ARGV[4], {'holders', 'queue', 'waits'}, {'in:'}},
  {ARGV[5], {'meta', 'holders', 'waits', 'wqueue'}, {'pend:', 'bell:', 'part:'}},
  {ARGV[5], {'observers'}, {'ob:'}},
}
for _, l in ipairs(layouts) do
  for _, src in ipairs(l[2]) do
    for id in pairs(ids_of(l[1] .. src)) do
      for _, sfx in ipairs(l[3]) do add(l[1] .. sfx .. id, 'list') end
    end
  end
end
if mode == 'delete' and wrong then
  return redis.error_reply('REDSEM_WRONGTYPE ' .. wrong)
end
if mode == 'delete' or mode == 'purge' then
  local ks = {}
  for i = 1, #out, 2 do ks[#ks + 1] = out[i] end
  for i = 1, #ks, 1000 do redis.call('DEL', unpack(ks, i, math.min(i + 999, #ks))) end
end
return out
`)

// layoutKeys returns the fixed keys of the Handle's name under the four
// layouts, the four meta keys first, their types, and the four bases. An
// election's mutex has a semaphore's keys under its own base.
func (h *Handle) layoutKeys() (keys []interface{}, types []interface{}, bases [4]string) {
	b := h.base
	bases = [4]string{b, b + "rw:", b + "rate:", b + "el:"}
	add := func(k, typ string) {
		keys = append(keys, k)
		types = append(types, typ)
	}
	for _, base := range bases {
		add(base+"meta", "hash")
	}
	for _, kt := range [][3]string{
		{b, "tokens", "list"}, {b, "leases", "zset"}, {b, "holders", "hash"}, {b, "waits", "zset"}, {b, "wqueue", "list"},
		{bases[1], "queue", "list"}, {bases[1], "leases", "zset"}, {bases[1], "holders", "hash"}, {bases[1], "waits", "zset"},
		{bases[2], "holders", "hash"}, {bases[2], "queue", "list"}, {bases[2], "waits", "zset"},
		{bases[3], "tokens", "list"}, {bases[3], "leases", "zset"}, {bases[3], "holders", "hash"}, {bases[3], "waits", "zset"},
		{bases[3], "wqueue", "list"}, {bases[3], "leader", "hash"}, {bases[3], "log", "list"}, {bases[3], "observers", "zset"},
	} {
		add(kt[0]+kt[1], kt[2])
	}
	for i := 1; i <= engine.MaxLimits; i++ {
		add(bases[2]+"log:"+strconv.Itoa(i), "zset")
	}
	return keys, types, bases
}

func (h *Handle) runKeys(ctx context.Context, op, mode string) ([]string, error) {
	keys, types, bases := h.layoutKeys()
	args := append(append(keys, mode, bases[0], bases[1], bases[2], bases[3]), types...)
	// The script takes a variable number of keys: tell EVAL how many.
	v, _, err := engine.Call(ctx, h.pool, keysScript.With(append([]interface{}{len(keys)}, args...)...))
	out, err := redis.Strings(v, err)
	if err != nil {
		return nil, engine.ScriptError(op, "name", h.name, err)
	}
	return out, nil
}

// Kinds reports which kinds of thing exist under the Handle's name, in the
// order semaphore, read-write lock, rate gate, election: those whose meta
// key exists (an election's is its mutex's, made by the first Campaign). A
// semaphore, a lock, a rate gate and an election of one name are apart, so
// there may be several. A meta key of the wrong type counts (reading that kind then
// fails with ErrWrongType); keys without their meta key do not (Keys lists
// them). One script call that writes nothing.
func (h *Handle) Kinds(ctx context.Context) ([]Kind, error) {
	types, err := h.runKeys(ctx, "kinds of", "kinds")
	if err != nil {
		return nil, err
	}
	if len(types) != 4 {
		return nil, fmt.Errorf("redsem: kinds of %q: unexpected reply %q", engine.Printable(h.name), types)
	}
	var kinds []Kind
	for i, k := range []Kind{KindSemaphore, KindRWMutex, KindRate, KindElection} {
		if types[i] != "none" {
			kinds = append(kinds, k)
		}
	}
	return kinds, nil
}

// Keys lists every key of the Handle's name under the four layouts
// (semaphore, read-write lock, rate gate, election), whatever their type:
// the fixed ones and those of acquisitions in flight (and an election's
// observers) that the fixed ones name. One script call that writes nothing.
func (h *Handle) Keys(ctx context.Context) ([]Key, error) {
	flat, err := h.runKeys(ctx, "keys of", "list")
	if err != nil {
		return nil, err
	}
	return h.toKeys(flat), nil
}

// Purge deletes every key Keys lists, whatever the kind and the type, in one
// atomic script, and returns them. Unlike Delete it needs no key of the
// right type: it is how to remove a name someone else wrote to. Holders of
// a semaphore or lock learn it at their next Refresh or Release
// (ErrLeaseLost), an election's leader at its next refresh (its
// leadership's context ends); the next acquisition creates the name
// afresh, with a new epoch. Calling it again after a connection error is safe.
func (h *Handle) Purge(ctx context.Context) ([]Key, error) {
	flat, err := h.runKeys(ctx, "delete", "purge")
	if err != nil {
		return nil, err
	}
	return h.toKeys(flat), nil
}

func (h *Handle) toKeys(flat []string) []Key {
	var out []Key
	for i := 0; i+1 < len(flat); i += 2 {
		k := Key{Key: flat[i], Type: flat[i+1], Kind: KindSemaphore}
		switch rest := strings.TrimPrefix(k.Key, h.base); {
		case strings.HasPrefix(rest, "rw:"):
			k.Kind = KindRWMutex
		case strings.HasPrefix(rest, "rate:"):
			k.Kind = KindRate
		case strings.HasPrefix(rest, "el:"):
			k.Kind = KindElection
		}
		out = append(out, k)
	}
	return out
}
