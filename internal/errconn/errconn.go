// Package errconn holds the redigo connection a pool hands out when it
// could not get a real one, so that redigo's Get (which cannot return an
// error) reports it on first use. The cluster and sentinel pools share it.
package errconn

import (
	"context"
	"time"
)

// Conn is a redis.Conn (with context and timeouts) that fails every call
// with the error it was made with.
type Conn struct{ err error }

// New returns a Conn that fails with err.
func New(err error) Conn { return Conn{err} }

func (e Conn) Err() error { return e.err }

func (e Conn) Close() error                                   { return nil }
func (e Conn) Do(string, ...interface{}) (interface{}, error) { return nil, e.err }
func (e Conn) Send(string, ...interface{}) error              { return e.err }
func (e Conn) Flush() error                                   { return e.err }
func (e Conn) Receive() (interface{}, error)                  { return nil, e.err }
func (e Conn) DoContext(context.Context, string, ...interface{}) (interface{}, error) {
	return nil, e.err
}
func (e Conn) ReceiveContext(context.Context) (interface{}, error) { return nil, e.err }
func (e Conn) DoWithTimeout(time.Duration, string, ...interface{}) (interface{}, error) {
	return nil, e.err
}
func (e Conn) ReceiveWithTimeout(time.Duration) (interface{}, error) { return nil, e.err }
