package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// Scopes of an SNS subscription filter policy (the subscription's FilterPolicyScope).
const (
	ScopeMessageAttributes = "MessageAttributes"
	ScopeMessageBody       = "MessageBody"
)

// FilterPolicy is an SNS subscription's filter policy: the messages of its topic the
// subscription delivers. An event it filters out is not expected in the consumer's inbox, so
// the audit does not count it as missing.
//
// It implements the policy language SNS documents: exact strings and numbers, prefix, suffix,
// equals-ignore-case, anything-but (values, a prefix or a suffix), numeric comparisons and
// ranges, exists, cidr, and $or; keys nest with the MessageBody scope. A condition other than
// "exists": false does not match a key the message lacks. sluice's attributes are all of type
// String, so a numeric condition on an attribute never matches (as in SNS).
type FilterPolicy struct {
	scope string
	root  map[string]any
}

// ParseFilterPolicy parses a subscription's FilterPolicy and FilterPolicyScope attributes (an
// empty scope is MessageAttributes, SNS's default).
func ParseFilterPolicy(policy, scope string) (*FilterPolicy, error) {
	if scope == "" {
		scope = ScopeMessageAttributes
	}
	if scope != ScopeMessageAttributes && scope != ScopeMessageBody {
		return nil, fmt.Errorf("filter policy scope %q: want %s or %s", scope, ScopeMessageAttributes, ScopeMessageBody)
	}
	dec := json.NewDecoder(strings.NewReader(policy))
	dec.UseNumber()
	var root map[string]any
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("filter policy %s: %w", policy, err)
	}
	p := &FilterPolicy{scope: scope, root: root}
	if err := p.check(root, 0); err != nil {
		return nil, fmt.Errorf("filter policy %s: %w", policy, err)
	}
	return p, nil
}

// check refuses what the policy language does not have, so that a policy is never half
// understood: an unknown operator would otherwise match nothing and report every event
// filtered.
func (p *FilterPolicy) check(obj map[string]any, depth int) error {
	for k, v := range obj {
		switch v := v.(type) {
		case []any:
			if k == "$or" {
				for _, alt := range v {
					m, ok := alt.(map[string]any)
					if !ok {
						return fmt.Errorf("$or wants objects")
					}
					if err := p.check(m, depth); err != nil {
						return err
					}
				}
				continue
			}
			for _, c := range v {
				if err := checkCondition(c); err != nil {
					return fmt.Errorf("key %s: %w", k, err)
				}
			}
		case map[string]any:
			if p.scope == ScopeMessageAttributes {
				return fmt.Errorf("key %s: nested keys need the %s scope", k, ScopeMessageBody)
			}
			if err := p.check(v, depth+1); err != nil {
				return err
			}
		default:
			return fmt.Errorf("key %s: want an array of conditions or an object", k)
		}
	}
	return nil
}

func checkCondition(c any) error {
	m, ok := c.(map[string]any)
	if !ok {
		return nil // a string, a number, true, false or null
	}
	if len(m) != 1 {
		return fmt.Errorf("a condition object has one operator, got %d", len(m))
	}
	for op := range m {
		switch op {
		case "prefix", "suffix", "equals-ignore-case", "anything-but", "numeric", "exists", "cidr":
		default:
			return fmt.Errorf("unknown operator %q", op)
		}
	}
	return nil
}

// Matches reports whether the subscription delivers a message with these String attributes
// and this body.
func (p *FilterPolicy) Matches(attrs map[string]string, body []byte) (bool, error) {
	if p.scope == ScopeMessageAttributes {
		return matchObject(p.root, func(k string) ([]any, bool, map[string]any) {
			v, ok := attrs[k]
			return []any{v}, ok, nil
		}, true), nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return false, nil // SNS delivers nothing of a body it cannot read as a JSON object
	}
	return matchObject(p.root, bodyLookup(doc), false), nil
}

// lookup returns a key's values (an array's elements), whether it is present, and, when it is
// an object, that object.
type lookup func(key string) (values []any, present bool, object map[string]any)

func bodyLookup(doc map[string]any) lookup {
	return func(k string) ([]any, bool, map[string]any) {
		v, ok := doc[k]
		if !ok {
			return nil, false, nil
		}
		switch v := v.(type) {
		case []any:
			return v, true, nil
		case map[string]any:
			return nil, true, v
		}
		return []any{v}, true, nil
	}
}

func matchObject(policy map[string]any, get lookup, attributes bool) bool {
	for k, v := range policy {
		switch v := v.(type) {
		case []any:
			if k == "$or" {
				matched := false
				for _, alt := range v {
					if matchObject(alt.(map[string]any), get, attributes) {
						matched = true
						break
					}
				}
				if !matched {
					return false
				}
				continue
			}
			values, present, _ := get(k)
			if !matchKey(v, values, present, attributes) {
				return false
			}
		case map[string]any:
			_, _, obj := get(k)
			if obj == nil {
				obj = map[string]any{}
			}
			if !matchObject(v, bodyLookup(obj), false) {
				return false
			}
		}
	}
	return true
}

// matchKey reports whether any condition matches any of the key's values.
func matchKey(conditions, values []any, present, attributes bool) bool {
	for _, c := range conditions {
		if m, ok := c.(map[string]any); ok {
			if e, ok := m["exists"]; ok {
				if e == present {
					return true
				}
				continue
			}
		}
		if !present {
			continue
		}
		for _, v := range values {
			if matchCondition(c, v, attributes) {
				return true
			}
		}
	}
	return false
}

func matchCondition(c, v any, attributes bool) bool {
	switch c := c.(type) {
	case string:
		s, ok := v.(string)
		return ok && s == c
	case json.Number:
		return !attributes && numEqual(v, c)
	case bool:
		b, ok := v.(bool)
		return ok && b == c
	case nil:
		return v == nil
	case map[string]any:
		for op, arg := range c {
			return matchOperator(op, arg, v, attributes)
		}
	}
	return false
}

func matchOperator(op string, arg, v any, attributes bool) bool {
	s, isString := v.(string)
	switch op {
	case "prefix":
		p, _ := arg.(string)
		return isString && strings.HasPrefix(s, p)
	case "suffix":
		p, _ := arg.(string)
		return isString && strings.HasSuffix(s, p)
	case "equals-ignore-case":
		p, _ := arg.(string)
		return isString && strings.EqualFold(s, p)
	case "cidr":
		p, _ := arg.(string)
		prefix, err := netip.ParsePrefix(p)
		if err != nil || !isString {
			return false
		}
		addr, err := netip.ParseAddr(s)
		return err == nil && prefix.Contains(addr)
	case "numeric":
		return !attributes && matchNumeric(arg, v)
	case "anything-but":
		switch a := arg.(type) {
		case []any:
			for _, x := range a {
				if matchCondition(x, v, attributes) {
					return false
				}
			}
			return true
		case map[string]any:
			return !matchCondition(a, v, attributes)
		default:
			return !matchCondition(a, v, attributes)
		}
	}
	return false
}

func number(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(n.String(), 64)
	return f, err == nil
}

func numEqual(v any, c json.Number) bool {
	f, ok := number(v)
	g, err := strconv.ParseFloat(c.String(), 64)
	return ok && err == nil && f == g
}

// matchNumeric evaluates ["=", 5], [">", 0, "<=", 10] and the like.
func matchNumeric(arg, v any) bool {
	f, ok := number(v)
	list, isList := arg.([]any)
	if !ok || !isList || len(list)%2 != 0 {
		return false
	}
	for i := 0; i < len(list); i += 2 {
		op, _ := list[i].(string)
		g, ok := number(list[i+1])
		if !ok {
			return false
		}
		var holds bool
		switch op {
		case "=":
			holds = f == g
		case "<":
			holds = f < g
		case "<=":
			holds = f <= g
		case ">":
			holds = f > g
		case ">=":
			holds = f >= g
		}
		if !holds || math.IsNaN(f) {
			return false
		}
	}
	return true
}
