package warmer

import "errors"

// Origin protection errors: a guarded source (sources/protect) refused to
// call its origin, or a source marks a failure worth retrying. They live
// here, beside the other load errors, because the warmer classifies them and
// the sources wrap them.
var (
	// ErrBreakerOpen means the source's circuit breaker is open (or half-open
	// with its trial call in flight): the load fails at once and the warmer
	// keeps the old values alive instead of calling the origin.
	ErrBreakerOpen = errors.New("origin circuit breaker open")
	// ErrOverloaded means no call slot (max_in_flight) or rate token came free
	// before the load's deadline.
	ErrOverloaded = errors.New("origin call limit reached")
	// ErrUnavailable marks an origin failure worth retrying: a connection
	// refused or reset, a timeout, an HTTP 5xx or 429. Sources wrap it.
	ErrUnavailable = errors.New("origin unavailable")
)
