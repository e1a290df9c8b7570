{{- /*
podjanitor.durationVariables: the admission policy's variables that parse the
duration annotation .name (policy.ParseDuration: Go's time.ParseDuration plus
the units d and w) into <var>Error, "" when it parses or is not set.

A duration is terms of a number and a unit ("1h30m", "1.5d"). <var>Good is
the longest run of terms that parse, <var>Bad the rest. The value of each
good term is summed in two halves (high and low 32 bits) so that a total past
the maximum (2^63-1 ns) is found without overflowing CEL's int. Go reports
the first error from the left; an earlier term too large wins over a later
bad one, as here. Fractions are exact up to 18 digits, as in Go.
*/ -}}
{{- define "podjanitor.durationVariables" -}}
{{- $v := .var }}
{{- $term := "(?:[0-9]+(?:[.][0-9]*)?|[.][0-9]+)" }}
- name: {{ $v }}
  expression: "'{{ .name }}' in variables.changed ? variables.annotations['{{ include "podjanitor.annotation" (dict "root" .root "name" .name) }}'] : ''"
- name: {{ $v }}Rest
  expression: "variables.{{ $v }}.startsWith('+') ? variables.{{ $v }}.substring(1) : variables.{{ $v }}"
- name: {{ $v }}Parsed
  expression: "variables.{{ $v }}Rest.find('^(?:{{ $term }}(?:ns|us|µs|μs|ms|s|m|h|d|w))*')"
# A unit that runs on ("1mx": unit "mx") is not the unit the regexp matched.
- name: {{ $v }}Good
  expression: >-
    size(variables.{{ $v }}Parsed) < size(variables.{{ $v }}Rest) &&
    !variables.{{ $v }}Rest.substring(size(variables.{{ $v }}Parsed)).matches('^[0-9.]')
    ? variables.{{ $v }}Parsed.substring(0, size(variables.{{ $v }}Parsed) -
    size(variables.{{ $v }}Parsed.find('{{ $term }}[^0-9.]+$')))
    : variables.{{ $v }}Parsed
- name: {{ $v }}Bad
  expression: variables.{{ $v }}Rest.substring(size(variables.{{ $v }}Good))
# Nanoseconds of each good term, -1 for a term too large on its own.
- name: {{ $v }}Values
  expression: >-
    variables.{{ $v }}Good.findAll('{{ $term }}[^0-9.]+').map(t,
    size(t.find('^[0-9]*').find('[1-9][0-9]*')) > 19 ||
    size(t.find('^[0-9]*').find('[1-9][0-9]*')) == 19 && t.find('^[0-9]*').find('[1-9][0-9]*') > '9223372036854775807' ||
    t.find('^[0-9]*').find('[1-9][0-9]*') != '' && (
    int(t.find('^[0-9]*').find('[1-9][0-9]*')) > 9223372036854775807 / variables.durationUnits[t.find('[^0-9.]+$')] ||
    int(t.find('^[0-9]*').find('[1-9][0-9]*')) * variables.durationUnits[t.find('[^0-9.]+$')] > 9223372036854775807 -
    (t.find('[.][0-9]+') == '' ? 0 : int(double(t.find('[.][0-9]{1,18}').substring(1)) *
    (double(variables.durationUnits[t.find('[^0-9.]+$')]) / double('1e' + string(size(t.find('[.][0-9]{1,18}')) - 1))))))
    ? -1 :
    (t.find('^[0-9]*').find('[1-9][0-9]*') == '' ? 0 :
    int(t.find('^[0-9]*').find('[1-9][0-9]*')) * variables.durationUnits[t.find('[^0-9.]+$')]) +
    (t.find('[.][0-9]+') == '' ? 0 : int(double(t.find('[.][0-9]{1,18}').substring(1)) *
    (double(variables.durationUnits[t.find('[^0-9.]+$')]) / double('1e' + string(size(t.find('[.][0-9]{1,18}')) - 1))))))
- name: {{ $v }}TooLarge
  expression: >-
    variables.{{ $v }}Values.exists(n, n < 0) ||
    variables.{{ $v }}Values.map(n, n / 4294967296).sum() +
    variables.{{ $v }}Values.map(n, n % 4294967296).sum() / 4294967296 >= 2147483648
# The number that starts the first bad term, and its unit.
- name: {{ $v }}BadNumber
  expression: variables.{{ $v }}Bad.find('^[0-9]*(?:[.][0-9]*)?')
- name: {{ $v }}BadUnit
  expression: variables.{{ $v }}Bad.substring(size(variables.{{ $v }}BadNumber)).find('^[^0-9.]*')
- name: {{ $v }}Error
  expression: >-
    !('{{ .name }}' in variables.changed) ? '' :
    variables.{{ $v }} == '' ? 'empty duration' :
    variables.{{ $v }}.startsWith('-') ? 'negative duration' :
    variables.{{ $v }}Rest == '0' ? '' :
    variables.{{ $v }}Rest == '' ? 'no number after ' + strings.quote(variables.{{ $v }}) :
    variables.{{ $v }}TooLarge ? 'too large: the maximum is 15250w1d23h47m16s854ms775us807ns' :
    variables.{{ $v }}Bad == '' ? '' :
    variables.{{ $v }}BadNumber == '' ? 'expected a number at ' + strings.quote(variables.{{ $v }}Bad) :
    size(variables.{{ $v }}BadNumber.find('^[0-9]*').find('[1-9][0-9]*')) > 19 ||
    size(variables.{{ $v }}BadNumber.find('^[0-9]*').find('[1-9][0-9]*')) == 19 &&
    variables.{{ $v }}BadNumber.find('^[0-9]*').find('[1-9][0-9]*') > '9223372036854775808'
    ? 'too large: the maximum is 15250w1d23h47m16s854ms775us807ns' :
    variables.{{ $v }}BadNumber == '.' ? 'expected a number at ' + strings.quote(variables.{{ $v }}Bad) :
    variables.{{ $v }}BadUnit == '' ? 'missing unit after ' + strings.quote(variables.{{ $v }}BadNumber) +
    ' (use one of ns, us, ms, s, m, h, d, w)' :
    'unknown unit ' + strings.quote(variables.{{ $v }}BadUnit)
{{- end }}
