package goredis

import (
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
)

// toReply turns a go-redis reply into what redigo would have returned for the
// same command over RESP2: bulk and status strings as []byte, integers as
// int64, arrays as []interface{}, a nil reply (go-redis's redis.Nil) as nil,
// and an error reply as redigo's redis.Error, so that redsem maps NOSCRIPT,
// WRONGTYPE, OOM and its own REDSEM_* codes as it does with redigo.
//
// RESP3 replies (go-redis speaks RESP3 unless Options.Protocol is 2) take
// their RESP2 shape: a map becomes a flat array of key, value pairs (sorted
// by key), a set an array, true 1 and false nil (as a Lua boolean is sent
// over RESP2), a double and a big number their decimal text.
func toReply(v interface{}, err error) reply {
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return reply{}
		}
		return reply{err: replyErr(err)}
	}
	return reply{v: toRedigo(v)}
}

// replyErr maps an error reply to redigo's redis.Error and passes every
// other error (connection, timeout, context) through.
func replyErr(err error) error {
	var re redis.Error
	if errors.As(err, &re) && !errors.Is(err, redis.Nil) {
		return redigo.Error(re.Error())
	}
	return err
}

func toRedigo(v interface{}) interface{} {
	switch v := v.(type) {
	case nil:
		return nil
	case string:
		return []byte(v)
	case int64:
		return v
	case []interface{}:
		out := make([]interface{}, len(v))
		for i, e := range v {
			out[i] = toRedigo(e)
		}
		return out
	case map[interface{}]interface{}:
		keys := make([]interface{}, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		out := make([]interface{}, 0, 2*len(v))
		for _, k := range keys {
			out = append(out, toRedigo(k), toRedigo(v[k]))
		}
		return out
	case bool:
		if v {
			return int64(1)
		}
		return nil
	case float64:
		return []byte(strconv.FormatFloat(v, 'f', -1, 64))
	case *big.Int:
		return []byte(v.String())
	case error:
		if errors.Is(v, redis.Nil) {
			return nil
		}
		var re redis.Error
		if errors.As(v, &re) {
			return redigo.Error(re.Error())
		}
		return v
	}
	return v
}

// isRedigoError reports whether err is an error reply (the connection is
// fine) rather than a connection, timeout or context error.
func isRedigoError(err error) bool {
	_, ok := err.(redigo.Error)
	return ok
}

// toArg turns an argument redigo accepts into one go-redis writes the same
// way: the basic types pass, redigo.Argument gives its RedisArg, anything
// else is printed with fmt, as redigo does.
func toArg(a interface{}) interface{} {
	switch a := a.(type) {
	case nil:
		return ""
	case string, []byte, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return a
	case float32:
		return strconv.FormatFloat(float64(a), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(a, 'g', -1, 64)
	case bool:
		if a {
			return "1"
		}
		return "0"
	case redigo.Argument:
		return toArg(a.RedisArg())
	case time.Duration:
		return int64(a)
	}
	return fmt.Sprint(a)
}
