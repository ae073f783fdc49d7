package core

import "context"

// Inbox makes each event take effect once per consumer.
//
// Process runs fn inside one database transaction that also records
// (consumer, eventID). If the pair was recorded before, fn does not run and
// Process returns (false, nil). If fn fails, the record and fn's writes roll
// back together and the error is returned, so the message can be redelivered.
// fn finds the transaction in its context, through the helpers of the
// adapter that implements the Inbox.
type Inbox interface {
	Process(ctx context.Context, consumer, eventID string, fn func(ctx context.Context) error) (processed bool, err error)
}
