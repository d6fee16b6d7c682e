/**
 * Debian's chromium, headless, driven over the DevTools protocol on a pipe
 * (--remote-debugging-pipe: JSON messages ended by a NUL byte, written to the browser's fd 3 and
 * read from its fd 4), so no WebSocket client or browser-automation package is needed. Started
 * with a fresh profile and nothing that reaches out (no sync, updates or background networking);
 * stopped by its pid, profile removed.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';

export const CHROMIUM = '/usr/bin/chromium';

interface Pending { resolve: (value: Record<string, unknown>) => void; reject: (err: Error) => void }

export class HeadlessChromium {
  #nextId = 1;
  #pending = new Map<number, Pending>();
  #buffer = '';
  #stderr = '';
  private constructor(private readonly child: ChildProcess, private readonly profile: string) {
    const fromBrowser = child.stdio[4] as Readable;
    fromBrowser.setEncoding('utf8');
    fromBrowser.on('data', (chunk: string) => this.#onData(chunk));
    child.stderr!.on('data', (c: Buffer) => { if (this.#stderr.length < 8192) this.#stderr += c.toString(); });
    child.on('exit', () => {
      for (const p of this.#pending.values()) p.reject(new Error(`chromium exited: ${this.#stderr.slice(-1000)}`));
      this.#pending.clear();
    });
  }

  static launch(options: { width?: number; height?: number } = {}): HeadlessChromium {
    const profile = mkdtempSync(join(tmpdir(), 'roamguard-chromium-'));
    const child = spawn(CHROMIUM, [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', `--user-data-dir=${profile}`, '--remote-debugging-pipe',
      `--window-size=${options.width ?? 1000},${options.height ?? 1400}`, 'about:blank',
    ], { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
    return new HeadlessChromium(child, profile);
  }

  #onData(chunk: string): void {
    this.#buffer += chunk;
    let end: number;
    while ((end = this.#buffer.indexOf('\0')) >= 0) {
      const message = JSON.parse(this.#buffer.slice(0, end)) as { id?: number; result?: Record<string, unknown>; error?: { message: string } };
      this.#buffer = this.#buffer.slice(end + 1);
      if (message.id === undefined) continue; // events: not needed here
      const pending = this.#pending.get(message.id);
      if (!pending) continue;
      this.#pending.delete(message.id);
      if (message.error) pending.reject(new Error(message.error.message));
      else pending.resolve(message.result ?? {});
    }
  }

  send(method: string, params: Record<string, unknown> = {}, sessionId?: string): Promise<Record<string, unknown>> {
    const id = this.#nextId++;
    const promise = new Promise<Record<string, unknown>>((resolve, reject) => this.#pending.set(id, { resolve, reject }));
    (this.child.stdio[3] as Writable).write(`${JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) })}\0`);
    return promise;
  }

  /** A new tab at `url`, attached: evaluate, click and screenshot in it. */
  async open(url: string): Promise<Tab> {
    const { targetId } = await this.send('Target.createTarget', { url }) as { targetId: string };
    const { sessionId } = await this.send('Target.attachToTarget', { targetId, flatten: true }) as { sessionId: string };
    return new Tab(this, sessionId);
  }

  async close(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = new Promise((r) => this.child.once('exit', r));
      this.child.kill('SIGTERM');
      const timer = setTimeout(() => this.child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(this.profile, { recursive: true, force: true });
  }
}

export class Tab {
  constructor(private readonly browser: HeadlessChromium, private readonly sessionId: string) {}

  /** Evaluates an expression in the page; returns its value (JSON-able). */
  async evaluate<T>(expression: string): Promise<T> {
    const result = await this.browser.send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true }, this.sessionId) as { result: { value: T }; exceptionDetails?: { text: string } };
    if (result.exceptionDetails) throw new Error(`page: ${result.exceptionDetails.text}: ${expression}`);
    return result.result.value;
  }

  /** A real mouse click (press and release) in the middle of the element `selector` finds. */
  async click(selector: string): Promise<void> {
    const box = await this.evaluate<{ x: number; y: number } | null>(`(() => { const e = document.querySelector(${JSON.stringify(selector)}); if (!e) return null; e.scrollIntoView({ block: 'center' }); const r = e.getBoundingClientRect(); return { x: r.x + r.width / 2, y: r.y + r.height / 2 }; })()`);
    if (!box) throw new Error(`nothing on the page matches ${selector}`);
    for (const type of ['mousePressed', 'mouseReleased']) {
      await this.browser.send('Input.dispatchMouseEvent', { type, x: box.x, y: box.y, button: 'left', clickCount: 1 }, this.sessionId);
    }
  }

  /** A PNG of the whole page. */
  async screenshot(): Promise<Buffer> {
    const { data } = await this.browser.send('Page.captureScreenshot', { format: 'png', captureBeyondViewport: true }, this.sessionId) as { data: string };
    return Buffer.from(data, 'base64');
  }
}
