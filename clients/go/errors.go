package dueflow

import (
	"fmt"
	"unicode/utf8"
)

// InvalidInputError is bad input at a door of dueflow: it names the field, the
// value and what is accepted. Nothing was written.
type InvalidInputError struct {
	Field    string
	Value    any
	Accepted string
}

func (e *InvalidInputError) Error() string {
	shown := fmt.Sprintf("%v", e.Value)
	if s, ok := e.Value.(string); ok {
		shown = fmt.Sprintf("%q", s)
	}
	if utf8.RuneCountInString(shown) > 200 {
		shown = string([]rune(shown)[:200]) + "..."
	}
	return fmt.Sprintf("%s: got %s; accepted: %s", e.Field, shown, e.Accepted)
}

func invalid(field string, value any, accepted string) error {
	return &InvalidInputError{Field: field, Value: value, Accepted: accepted}
}

// KafkaError wraps a failed Kafka call; Retriable says whether trying again may help.
type KafkaError struct {
	Op        string
	Err       error
	Retriable bool
}

func (e *KafkaError) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *KafkaError) Unwrap() error { return e.Err }
