/**
 * The agent's log (control/log.ts, pino): JSON lines and the text form, levels, and keys never
 * reaching a line.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { REDACTED, createAgentLogger, jsonLineToText, redactKeys, type AgentLogLevel } from '../../control/log.ts';

const NOW = new Date('2026-01-02T03:04:05.678Z');

function capture(level: AgentLogLevel, json: boolean) {
  const lines: string[] = [];
  const log = createAgentLogger({ level, json, write: (line) => lines.push(line), now: () => NOW });
  return { log, lines };
}

/** A real-looking private key: 32 random bytes in base64 (44 characters). */
function base64Key(): string {
  return randomBytes(32).toString('base64');
}

describe('agent log', () => {
  test('JSON: one object per line with level, time, msg and the fields (undefined left out)', () => {
    const { log, lines } = capture('info', true);
    log.info('added a peer', { node: 'node-2', key: 'xTIBA5rb', allowedIps: ['10.244.2.0/24', 'fd00::/64'], port: 51820, gone: undefined, ok: true });
    assert.equal(lines.length, 1);
    assert.deepEqual(JSON.parse(lines[0]), {
      level: 'info', time: NOW.toISOString(), msg: 'added a peer', node: 'node-2', key: 'xTIBA5rb',
      allowedIps: ['10.244.2.0/24', 'fd00::/64'], port: 51820, ok: true,
    });
  });

  test('text: time LEVEL message key=value, quoting values with spaces', () => {
    const { log, lines } = capture('debug', false);
    log.warn('skipping a node', { node: 'node-3', reason: 'bad pod CIDR', cidrs: ['a', 'b'] });
    assert.equal(lines[0], `${NOW.toISOString()} WARN  skipping a node node=node-3 reason="bad pod CIDR" cidrs=a,b`);
    assert.equal(jsonLineToText('not json'), 'not json');
  });

  test('levels: below the threshold nothing is written; silent writes nothing', () => {
    const info = capture('info', true);
    info.log.debug('hidden');
    info.log.info('shown');
    info.log.error('shown too');
    assert.deepEqual(info.lines.map((l) => JSON.parse(l).msg), ['shown', 'shown too']);
    assert.deepEqual(info.lines.map((l) => JSON.parse(l).level), ['info', 'error']);
    const silent = capture('silent', true);
    silent.log.error('nothing');
    assert.deepEqual(silent.lines, []);
  });

  test('a private key in the fields, in an array, in the message or in hex never reaches a line', () => {
    for (const json of [true, false]) {
      const { log, lines } = capture('debug', json);
      const key = base64Key();
      const hex = randomBytes(32).toString('hex');
      log.info(`loaded ${key}`, { key, keys: ['short', key], error: `bad key ${key} in file`, hexKey: hex, node: 'node-1' });
      log.error('oops', { privateKey: 'anything at all', presharedKey: 'x', token: 'abc' });
      const text = lines.join('\n');
      assert.ok(!text.includes(key), `the key leaked (${json ? 'json' : 'text'}): ${text}`);
      assert.ok(!text.includes(hex), `the hex key leaked: ${text}`);
      assert.ok(!text.includes('anything at all') && !text.includes('abc'), `a secret field leaked: ${text}`);
      assert.ok(text.includes(REDACTED));
      assert.ok(text.includes('node-1'), 'other fields stay');
      if (json) {
        const first = JSON.parse(lines[0]);
        assert.equal(first.key, REDACTED);
        assert.deepEqual(first.keys, ['short', REDACTED]);
        assert.equal(first.error, `bad key ${REDACTED} in file`);
        assert.equal(first.msg, `loaded ${REDACTED}`);
      }
    }
  });

  test('short keys, CIDRs, endpoints and longer base64 are not mistaken for keys', () => {
    for (const text of ['xTIBA5rb', '10.244.0.0/16', '[fd00::1]:51820', 'node-1', randomBytes(48).toString('base64')]) {
      assert.equal(redactKeys(text), text);
    }
    assert.equal(redactKeys(`a=${base64Key()},b`), `a=${REDACTED},b`);
  });

  test('fields named like pino\'s own keys do not overwrite them', () => {
    const { log, lines } = capture('info', true);
    log.info('message', { level: 'x', msg: 'y', time: 'z' });
    const record = JSON.parse(lines[0]);
    assert.equal(record.level, 'info');
    assert.equal(record.msg, 'message');
    assert.equal(record.field_msg, 'y');
  });
});
