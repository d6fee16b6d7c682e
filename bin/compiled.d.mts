// Types of bin/compiled.mjs (plain JavaScript, see there).
export declare const MANIFEST: string;
export declare const MANIFEST_FORMAT: number;
export declare function compiledPath(source: string): string;
export declare function fingerprint(root: string, path: string): { size: number; mtimeMs: number; sha256: string };
export declare function staleReason(root: string): string | undefined;
