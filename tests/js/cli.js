'use strict'
// Shared by mqtt_sub.js and mqtt_pub.js: argument parsing, connecting, and one way to end.
//
// Exit codes: 0 done, 1 MQTT or network error (message on stderr), 2 bad usage,
// 124 overall timeout (as timeout(1)).

const { parseArgs } = require('node:util')
const mqtt = require('mqtt')

const DEFAULT_TIMEOUT_S = 30

let finished = false

// Ends the process once: prints `message` on stderr when given, lets stdout drain, exits.
function finish (code, message) {
  if (finished) return
  finished = true
  if (message) process.stderr.write(`${message}\n`)
  process.stdout.write('', () => process.exit(code))
}

// Parses argv into { positionals, values }; exits 2 with `usage` on anything unexpected.
function parse (usage, positionalCount, options) {
  let parsed
  try {
    parsed = parseArgs({
      args: process.argv.slice(2),
      allowPositionals: true,
      strict: true,
      options: {
        'protocol-version': { type: 'string', default: '5' },
        qos: { type: 'string', default: '0' },
        timeout: { type: 'string', default: String(DEFAULT_TIMEOUT_S) },
        ...options
      }
    })
  } catch (err) {
    finish(2, `${err.message}\nusage: ${usage}`)
    return null
  }
  const { positionals, values } = parsed
  const version = Number(values['protocol-version'])
  const qos = Number(values.qos)
  const timeout = Number(values.timeout)
  const problems = []
  if (positionals.length !== positionalCount) {
    problems.push(`expected ${positionalCount} arguments, got ${positionals.length}`)
  }
  if (version !== 4 && version !== 5) problems.push('--protocol-version must be 4 or 5')
  if (![0, 1, 2].includes(qos)) problems.push('--qos must be 0, 1 or 2')
  if (!(timeout > 0)) problems.push('--timeout must be a positive number of seconds')
  if (problems.length) {
    finish(2, `${problems.join('; ')}\nusage: ${usage}`)
    return null
  }
  return { positionals, values: { ...values, version, qos, timeout } }
}

// Connects once (no reconnect); any error, refusal, server DISCONNECT or early close ends
// the process with exit 1, and the whole run is bounded by `timeout` seconds.
function connect (url, { version, timeout }) {
  const timer = setTimeout(() => finish(124, `timed out after ${timeout} s`), timeout * 1000)
  const client = mqtt.connect(url, {
    protocolVersion: version,
    clean: true,
    reconnectPeriod: 0,
    connectTimeout: timeout * 1000
  })
  client.on('error', (err) => finish(1, `mqtt error: ${err.message}`))
  client.on('disconnect', (packet) => {
    finish(1, `server sent DISCONNECT, reason code ${packet.reasonCode ?? 0}`)
  })
  client.on('close', () => finish(1, 'connection closed'))
  return client
}

// Disconnects cleanly, then exits 0: the work is done, so an error while saying goodbye is
// only noted on stderr. Deferred one turn because MQTT.js emits 'message' before it sends
// the PUBACK/PUBREC: that ack goes out ahead of the DISCONNECT.
function disconnect (client) {
  client.removeAllListeners('close')
  client.removeAllListeners('error')
  client.on('error', (err) => process.stderr.write(`ignored while disconnecting: ${err.message}\n`))
  setImmediate(() => client.end(false, {}, () => finish(0)))
}

module.exports = { connect, disconnect, finish, parse }
