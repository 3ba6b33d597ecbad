/**
 * The path-lease tree of one workspace, built from its live leases (pure, no database): every
 * leased key becomes a node, with its ancestors as the nodes above it, so an operator sees which
 * holder owns which prefix and what lies under it.
 */
import type { PathHolderView, PathNode } from './types.js';

interface MutableNode {
  name: string;
  path: string;
  leases: PathHolderView[];
  children: Map<string, MutableNode>;
}

/**
 * Builds the tree of `leases` (workspace-relative paths, `''` = the whole workspace). Children are
 * sorted by name; leases on one node by holder.
 *
 * @example
 * buildPathTree([{ path: 'src', lease }, { path: 'src/a.ts', lease: other }]);
 * // { name: '', path: '', leases: [], children: [{ name: 'src', leases: [lease], children: [{ name: 'a.ts', … }] }] }
 */
export function buildPathTree(leases: readonly { readonly path: string; readonly lease: PathHolderView }[]): PathNode {
  const root: MutableNode = { name: '', path: '', leases: [], children: new Map() };
  for (const { path, lease } of leases) {
    let node = root;
    if (path !== '') {
      for (const segment of path.split('/')) {
        let child = node.children.get(segment);
        if (!child) {
          child = {
            name: segment,
            path: node.path === '' ? segment : `${node.path}/${segment}`,
            leases: [],
            children: new Map(),
          };
          node.children.set(segment, child);
        }
        node = child;
      }
    }
    node.leases.push(lease);
  }
  const freeze = (node: MutableNode): PathNode => ({
    name: node.name,
    path: node.path,
    leases: [...node.leases].sort((a, b) => (a.holder < b.holder ? -1 : a.holder > b.holder ? 1 : 0)),
    children: [...node.children.values()].sort((a, b) => (a.name < b.name ? -1 : 1)).map(freeze),
  });
  return freeze(root);
}
